"""Errors raised on bad user input. Each names the field, the value found and the fix."""
from __future__ import annotations


class HierConfigError(ValueError):
    """A ``zeropp_hier`` config section (or a DeepSpeed setting next to it) is invalid.

    The message always has the form ``<field>: got <value>; <what to do>`` so that a user
    reading a failed job log knows which line of their JSON to change.
    """

    def __init__(self, field: str, value: object, fix: str):
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"zeropp_hier config error at '{field}': got {value!r}; {fix}")


class HierTopologyError(HierConfigError):
    """The declared topology does not fit the world that was actually launched."""


class DeepSpeedVersionError(ImportError):
    """The installed DeepSpeed is outside the range whose internals this package was built on."""
