"""The DeepSpeed and torch versions this package runs on.

DeepSpeed: the stage-3 subclass overrides private, name-mangled methods and replaces the
per-parameter gather (docs/design.md#deepspeed-hook-points); those move between DeepSpeed
releases. A version other than the declared one gets a clear error at import, not a traceback
from deep inside a training step. The declared version is what ran: 0.19.8 passes the unit and
dist lanes (the newest release the index listed on 2026-11-29); 0.19.0 passes the unit lane and
fails the dist lane (its ``Init`` sets no ``ds_zero_partition_world_size`` on a parameter, which
partition.py reads; DeepSpeed added it in 0.19.3), and 0.19.1-0.19.7 have not run.

[Note: the torch versions claimed]
pyproject.toml declares the tested versions and nothing wider: ``torch==2.13.0`` and
``deepspeed==0.19.8``, the ones the suites ran on, ends included. torch, though, comes from the
platform's own index (OLCF's ROCm 2.10.0 on Frontier; a CUDA or ROCm build elsewhere), and PyPI's
Linux torch is a CUDA build, so pip resolving the pin on such a machine would replace the
platform's torch with a CUDA one. The install scripts therefore keep the installed torch: they
install the other requirements (``scripts/requirements.py --without torch``) and the package
with ``--no-deps`` (scripts/frontier/install.sh always, scripts/install.sh when it keeps a
torch). Such a torch is untested, and is said to be at import, not hidden: one warning (from
rank 0 only: at 75,264 ranks one line per rank would bury the job's log) naming the version
found, the tested one and the fix; ``ZEROPP_HIER_UNTESTED_TORCH_OK=1`` silences it. A local
label (``2.13.0+cpu``) is the same version; a patch release (``2.13.1``) is not, and warns. Below
the floor (reachable only through ``--no-deps``) is refused: the package calls APIs older torch
lacks (``torch.load(mmap=True)``, model/pretrained.py).
"""

from __future__ import annotations

import os
import warnings
from typing import Mapping

from ..core.errors import DeepSpeedVersionError, TorchVersionError

SUPPORTED_DEEPSPEED = ((0, 19, 8), (0, 19, 9))  # [min, max): 0.19.8 only, the tested one
SUPPORTED_TEXT = "==0.19.8"  # pyproject.toml's requirement, word for word
TORCH_FLOOR = (2, 1)  # below: refused (reachable only through an install with --no-deps)
# every torch a whole suite ran on (pyproject.toml declares the same); a local label such as
# +cpu is the same version, a patch release is another one
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
    v = (_parse(version) + (0, 0, 0))[:3]
    if v in {(_parse(t) + (0, 0, 0))[:3] for t in TESTED_TORCH}:
        return None
    fix = (
        f"install torch=={' or '.join(TESTED_TORCH)} from your platform's index (ROCm: "
        "https://download.pytorch.org/whl/rocm<version>, CPU: https://download.pytorch.org/whl/cpu; "
        "PyPI's Linux torch is a CUDA build)"
    )
    if v[:2] < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        return "refuse", f"zeropp_hier needs torch >= {floor} but found torch {version}; {fix}"
    return "warn", (
        f"zeropp_hier declares and was tested with torch {TESTED_TORCH_TEXT} only and found torch {version}, "
        f"which is untested; to run on the tested version {fix}; to keep this torch and silence this warning "
        f"set {SILENCE_ENV}=1"
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
