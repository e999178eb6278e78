"""Plain relative file names, the one rule every name a checkpoint records or joins obeys (pure)."""

from __future__ import annotations

import os
from typing import Any

GLOB_CHARS = "*?[]"


def name_problem(name: Any) -> str | None:
    """Why ``name`` is not a plain relative file name (None if it is): DeepSpeed joins tags and
    file names into paths and glob patterns, so ``..``, absolute paths and glob characters would
    reach files outside the tag."""
    if not isinstance(name, str) or not name:
        return "empty"
    if any(ord(c) < 32 for c in name):
        return "a control character"
    if name.startswith("/") or os.path.isabs(name):
        return "an absolute path"
    if "\\" in name:
        return "a backslash"
    if any(c in name for c in GLOB_CHARS):
        return f"a glob character ({GLOB_CHARS})"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "a '.', '..' or empty path component"
    return None
