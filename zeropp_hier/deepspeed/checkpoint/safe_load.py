"""Loading checkpoint files without running code.

[Note: tensors-only loading]
A torch checkpoint file is a pickle: loading it with ``weights_only=False`` (what DeepSpeed's
loader, ``ds_to_universal`` and ``zero_to_fp32`` all pass) calls whatever function the file
names, so anyone who can write the checkpoint directory can run code in every rank of the next
job. Here every checkpoint file is read with ``torch.load(weights_only=True)`` (tensors,
containers and numbers only) plus an explicit allowlist of the few classes a real checkpoint of
this package holds. The list was found by saving real checkpoints of every preset (zero3,
zeropp, frontier), fp32 and bf16, with and without error-feedback state, and of their universal
conversions, and listing what ``torch.serialization.get_unsafe_globals_in_checkpoint``
reported (``tests/dist/test_checkpoint_trust.py`` repeats that survey):

- ``LossScaler`` and ``ZeroStageEnum``: DeepSpeed's stage-3 optimizer state pickles its loss
  scaler object and its stage enum;
- ``DynamicLossScaler``: the loss scaler of fp16 with dynamic scaling (same field; not
  producible on the CPU the survey runs on, taken from DeepSpeed's stage-3 ``state_dict``).

Each of these is rebuilt from plain attributes; none runs code when unpickled. Anything else is
refused with ``UntrustedCheckpointError`` naming the type and the file. The opt-out is explicit
and per job: ``zeropp_hier.checkpoint.trust_pickles: true`` (or ``trust_pickles=True`` to
``load_checkpoint``, ``--trust-pickles`` to the ``checkpoint`` commands), for a checkpoint whose
writer the user trusts.

Two layers use the same list: ``scan`` statically lists a file's pickled globals before any
rank loads anything (so the refusal is agreed on every rank, see ``checkpoint.verify_for_load``),
and ``tensors_only`` makes every ``torch.load`` DeepSpeed issues inside it a tensors-only load
(the scan cannot see globals a pickle builds dynamically; the restricted unpickler can).
DeepSpeed routes its engine's loads through a ``CheckpointEngine`` but calls ``torch.load``
directly in ``zero_to_fp32``, ``ds_to_universal`` and the universal-checkpoint load of stage 3,
so ``tensors_only`` rebinds ``torch.load`` itself for the duration of one load or conversion
(one thread: the engine loads on the main thread, and its collective lanes never load files).
"""

from __future__ import annotations

import contextlib
import pickle
from typing import Any, Iterator

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from ...core.errors import HierCheckpointError

TRUST_FIX = (
    "if you trust whoever wrote this checkpoint, set zeropp_hier.checkpoint.trust_pickles: true "
    "(or pass trust_pickles=True to load_checkpoint, --trust-pickles to 'zeropp-hier checkpoint'); "
    "otherwise do not load it"
)


_UNTRUSTED = "holds pickled "


def untrusted_problem(types: list[str]) -> str:
    return (
        f"{_UNTRUSTED}{sorted(types)}, outside the types tensors-only loading allows "
        f"({allowed_names()}): loading it could run code"
    )


def is_untrusted(problem: str) -> bool:
    return problem.startswith(_UNTRUSTED)


class UntrustedCheckpointError(HierCheckpointError):
    """A checkpoint file holds a pickled type outside the tensors-only allowlist."""

    def __init__(self, path: str, problem: str, fix: str = TRUST_FIX):
        super().__init__(path, problem, fix)


def allowed_globals() -> list:
    """The classes a real checkpoint needs beyond torch's own tensors-only set ([Note:
    tensors-only loading])."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    return [LossScaler, DynamicLossScaler, ZeroStageEnum]


def allowed_names() -> list[str]:
    return sorted(f"{c.__module__}.{c.__qualname__}" for c in allowed_globals())


def scan(path: str) -> list[str]:
    """The pickled globals of the torch file ``path`` outside the allowlist (empty: the file is
    tensors-only). Reads the pickle only, never unpickles it. A file that is not a torch zip
    file cannot be checked this way and is reported as such."""
    with torch.serialization.safe_globals(allowed_globals()):
        try:
            return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except (ValueError, RuntimeError, pickle.UnpicklingError) as e:
            return [f"<unreadable as a torch zip checkpoint: {e}>"]


_real_load = torch.load


def load(f: Any, map_location: Any = None, trust: bool = False, **kwargs) -> Any:
    """``torch.load`` of one checkpoint file: tensors-only with the allowlist unless ``trust``."""
    kwargs.pop("weights_only", None)  # DeepSpeed passes False: that is the decision made here
    if trust:
        return _real_load(f, map_location=map_location, weights_only=False, **kwargs)
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            return _real_load(f, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        name = f if isinstance(f, str) else getattr(f, "name", repr(f))
        found = scan(f) if isinstance(f, str) else []
        why = found or [f"<refused by torch's tensors-only unpickler: {str(e).strip().splitlines()[-1]}>"]
        raise UntrustedCheckpointError(str(name), untrusted_problem(why)) from None


@contextlib.contextmanager
def tensors_only(trust: bool = False) -> Iterator[None]:
    """Every ``torch.load`` inside goes through ``load`` (with ``trust``)."""
    if torch.load is not _real_load:  # nested: the outer rule stays
        yield
        return

    def guarded(f, map_location=None, **kwargs):
        return load(f, map_location, trust, **kwargs)

    torch.load = guarded  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.load = _real_load


class TensorsOnlyCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine, loading tensors-only ([Note: tensors-only
    loading]); ``HierEngine`` sets ``trust_pickles`` from its config."""

    trust_pickles = False

    def load(self, path: str, map_location=None):
        return load(path, map_location, self.trust_pickles)
