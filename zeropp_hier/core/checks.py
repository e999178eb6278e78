"""The small checks that every parser of a config section uses (``config.py``, ``policy.py``):
each failure is a ``HierConfigError`` naming the field, the value and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from .errors import HierConfigError

if TYPE_CHECKING:  # typing.TypeGuard is Python 3.10's
    from typing import TypeGuard


def is_int(v: object) -> TypeGuard[int]:
    """A JSON integer: ``True``/``False`` are ints to Python but not counts."""
    return isinstance(v, int) and not isinstance(v, bool)


def check_mapping(v: object, field: str) -> Mapping[str, object]:
    if not isinstance(v, Mapping):
        raise HierConfigError(field, v, "expected a JSON object")
    return v


def check_keys(d: Mapping[str, object], allowed: tuple[str, ...], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise HierConfigError(f"{where}.{k}", d[k], f"unknown key; allowed keys are {list(allowed)}")
