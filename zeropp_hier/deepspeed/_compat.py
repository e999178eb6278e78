"""The DeepSpeed versions whose internals this package hooks into.

The stage-3 subclass overrides private, name-mangled methods and replaces the per-parameter
gather (docs/design.md#deepspeed-hook-points); those move between DeepSpeed releases. A version outside the range
gets a clear error at import, not a traceback from deep inside a training step.
"""

from __future__ import annotations

from ..core.errors import DeepSpeedVersionError

SUPPORTED_DEEPSPEED = ((0, 19), (0, 20))  # [min, max): 0.19.x, where the hooks were verified
SUPPORTED_TEXT = ">=0.19.0,<0.20.0"


def _parse(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_deepspeed_version(version: str) -> None:
    v = _parse(version)
    lo, hi = SUPPORTED_DEEPSPEED
    if not (lo <= v[:2] < hi):
        raise DeepSpeedVersionError(
            f"zeropp_hier supports DeepSpeed {SUPPORTED_TEXT} but found DeepSpeed {version}; "
            f"install a supported version: pip install 'deepspeed{SUPPORTED_TEXT}'"
        )


def require_supported_deepspeed() -> None:
    try:
        import deepspeed
    except ImportError as e:  # pragma: no cover - exercised only without DeepSpeed installed
        raise DeepSpeedVersionError(
            f"zeropp_hier needs DeepSpeed {SUPPORTED_TEXT}, which is not installed: "
            f"pip install 'deepspeed{SUPPORTED_TEXT}'"
        ) from e
    check_deepspeed_version(deepspeed.__version__)
