"""The small checks that every parser of a config section uses (``config.py``, ``policy.py``):
each failure is a ``HierConfigError`` naming the field, the value and the fix."""

from __future__ import annotations

from typing import Any, Mapping

from .errors import HierConfigError


def is_int(v: Any) -> bool:
    """A JSON integer: ``True``/``False`` are ints to Python but not counts."""
    return isinstance(v, int) and not isinstance(v, bool)


def check_mapping(v: Any, field: str) -> Mapping:
    if not isinstance(v, Mapping):
        raise HierConfigError(field, v, "expected a JSON object")
    return v


def check_keys(d: Mapping, allowed: tuple[str, ...], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise HierConfigError(f"{where}.{k}", d[k], f"unknown key; allowed keys are {list(allowed)}")
