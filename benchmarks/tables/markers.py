"""The marked regions of a Markdown file: ``<!-- table:NAME -->`` opens one, ``<!-- /table:NAME -->``
closes it, each on its own line; what lies between is the rendered table. Pure text functions."""

from __future__ import annotations

import re
from typing import NamedTuple

OPEN = re.compile(r"^<!-- table:([\w.-]+) -->$", re.M)
CLOSE = "<!-- /table:{} -->"


class Region(NamedTuple):
    name: str
    start: int  # first character of the body (after the opening line's newline)
    end: int  # first character of the closing line


class MarkerError(ValueError):
    pass


def regions(text: str, where: str = "<text>") -> list[Region]:
    """Every marked region of ``text`` in order. A region opened twice, or not closed, is refused
    naming the file and the table."""
    found: list[Region] = []
    for m in OPEN.finditer(text):
        name = m.group(1)
        close = CLOSE.format(name)
        end = text.find("\n" + close + "\n", m.end())
        if end < 0 and text.endswith("\n" + close):
            end = len(text) - len(close) - 1
        if end < 0:
            raise MarkerError(f"{where}: table {name!r} is opened but not closed; add a line {close!r} after it")
        found.append(Region(name, m.end() + 1, end + 1))
    names = [r.name for r in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise MarkerError(f"{where}: tables {twice} are marked more than once; keep one region per table")
    return found


def replace(text: str, bodies: dict[str, str], where: str = "<text>") -> str:
    """``text`` with each named region's body replaced by ``bodies[name]`` (a trailing newline
    added where missing); regions not named stay as they are."""
    out, at = [], 0
    for r in regions(text, where):
        if r.name not in bodies:
            continue
        body = bodies[r.name]
        out += [text[at : r.start], body if body.endswith("\n") else body + "\n"]
        at = r.end
    out.append(text[at:])
    return "".join(out)


def body(text: str, name: str, where: str = "<text>") -> str:
    """The current body of region ``name``."""
    for r in regions(text, where):
        if r.name == name:
            return text[r.start : r.end]
    raise MarkerError(f"{where}: no table {name!r}; mark it with <!-- table:{name} --> ... {CLOSE.format(name)}")
