"""The DeepSpeed and torch versions this package runs on.

DeepSpeed: the stage-3 subclass overrides private, name-mangled methods and replaces the
per-parameter gather (docs/design.md#deepspeed-hook-points); those move between DeepSpeed
releases. A version outside the range gets a clear error at import, not a traceback from deep
inside a training step. The range is what ran: 0.19.8 passes the unit and dist lanes; 0.19.0 passes
the unit lane and fails the dist lane (its ``Init`` sets no ``ds_zero_partition_world_size`` on a
parameter, which partition.py reads; DeepSpeed added it in 0.19.3), and 0.19.1-0.19.7 have not run.

[Note: the torch versions claimed]
pip's requirement on torch stays loose (``torch>=2.1`` in pyproject.toml) on purpose: torch comes
from the platform's own index (ROCm on Frontier, scripts/frontier/install.sh; CPU or CUDA
elsewhere) and PyPI's Linux torch is a CUDA build, so a floor above the user's installed torch
would make ``pip install zeropp-hier`` replace their ROCm build with a CUDA one. The claim is made
here instead, at import: the suites ran on ``TESTED_TORCH`` only; any other torch at or above
the floor works as far as anyone knows but is untested, and gets one warning (from rank 0 only:
at 75,264 ranks one line per rank would bury the job's log) naming the version, the tested ones
and the fix. Below the floor (reachable only by installing with ``--no-deps``) is refused: the
package calls APIs older torch lacks (``torch.load(mmap=True)``, model/pretrained.py).
"""

from __future__ import annotations

import os
import warnings
from typing import Mapping

from ..core.errors import DeepSpeedVersionError, TorchVersionError

SUPPORTED_DEEPSPEED = ((0, 19, 8), (0, 20, 0))  # [min, max): the tested 0.19.8 and any later 0.19.x
SUPPORTED_TEXT = ">=0.19.8,<0.20.0"
TORCH_FLOOR = (2, 1)  # pyproject.toml's torch>=2.1: refused below
# every torch a whole suite ran on; a patch release of one of them counts as tested (same minor)
TESTED_TORCH = ("2.13.0",)
TESTED_TORCH_TEXT = "2.13.0 (CPU build)"
SILENCE_ENV = "ZEROPP_HIER_UNTESTED_TORCH_OK"


class UntestedTorchWarning(UserWarning):
    """The installed torch is not one the project's suites ran on ([Note: the torch versions claimed])."""


def _parse(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_deepspeed_version(version: str) -> None:
    v = (_parse(version) + (0, 0, 0))[:3]
    lo, hi = SUPPORTED_DEEPSPEED
    if not (lo <= v < hi):
        raise DeepSpeedVersionError(
            f"zeropp_hier supports DeepSpeed {SUPPORTED_TEXT} but found DeepSpeed {version}; "
            f"install a supported version: pip install 'deepspeed{SUPPORTED_TEXT}'"
        )


def torch_version_problem(version: str) -> tuple[str, str] | None:
    """``("refuse" | "warn", message)`` for a torch outside the tested set, None for a tested one.
    Pure: the caller decides what to do with it."""
    v = _parse(version)[:2]
    if v in {_parse(t)[:2] for t in TESTED_TORCH}:
        return None
    fix = (
        f"install torch {' or '.join(TESTED_TORCH)} from your platform's index (ROCm: "
        "https://download.pytorch.org/whl/rocm<version>, CPU: https://download.pytorch.org/whl/cpu; "
        "PyPI's Linux torch is a CUDA build)"
    )
    if v < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        return "refuse", f"zeropp_hier needs torch >= {floor} but found torch {version}; {fix}"
    return "warn", (
        f"zeropp_hier was tested with torch {TESTED_TORCH_TEXT} only and found torch {version}, which is "
        f"untested; to run on tested versions {fix}; to keep this torch and silence this warning set {SILENCE_ENV}=1"
    )


def _rank_zero(env: Mapping[str, str]) -> bool:
    return env.get("RANK", env.get("SLURM_PROCID", "0")) == "0"


def check_torch_version(version: str, env: Mapping[str, str] = os.environ) -> None:
    """Refuses a torch below the floor, warns (rank 0, once) on one the suites did not run on."""
    problem = torch_version_problem(version)
    if problem is None:
        return
    kind, message = problem
    if kind == "refuse":
        raise TorchVersionError(message)
    if env.get(SILENCE_ENV) != "1" and _rank_zero(env):
        warnings.warn(message, UntestedTorchWarning, stacklevel=3)


def require_supported_deepspeed() -> None:
    try:
        import deepspeed
    except ImportError as e:  # pragma: no cover - exercised only without DeepSpeed installed
        raise DeepSpeedVersionError(
            f"zeropp_hier needs DeepSpeed {SUPPORTED_TEXT}, which is not installed: "
            f"pip install 'deepspeed{SUPPORTED_TEXT}'"
        ) from e
    check_deepspeed_version(deepspeed.__version__)
    import torch  # DeepSpeed imported it already

    check_torch_version(torch.__version__)
