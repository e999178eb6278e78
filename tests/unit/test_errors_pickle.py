"""Every zeropp_hier error survives pickling with its message and attributes: errors cross process
boundaries (a multiprocessing pool's result, a launcher's report), and one that cannot be rebuilt
there kills the receiver's result thread and leaves the parent waiting forever."""

import pickle

import pytest

from zeropp_hier.comm.failures import HierCommError
from zeropp_hier.core.errors import (
    HierConfigError,
    HierNonFiniteError,
    HierSkippedStepsError,
    HierTopologyError,
    HierUnsafeSaveError,
)

ERRORS = [
    HierConfigError("zeropp_hier.compression.block_size", 100, "use a power of two"),
    HierTopologyError("topology", (2, 2, 2), "launch 8 ranks"),
    HierNonFiniteError(3, 1, "grad_reduce", "node", "its local gradient", [{"phase": "grad_reduce"}]),
    HierSkippedStepsError(2, [{"step": 4, "cause": "non-finite gradient"}, {"step": 5, "cause": "overflow"}]),
    HierUnsafeSaveError("zeropp_hier: refusing to save a checkpoint on rank 0"),
    HierCommError(
        rank=1,
        phase="forward_gather",
        tier="node",
        axes=("node",),
        peers=(0,),
        kind="timeout",
        timeout_s=5.0,
        cause="Timed out waiting 5000ms",
        setting="deepspeed_group_timeout_s",
    ),
]


@pytest.mark.parametrize("err", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_round_trip_through_pickle(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)


def test_checkpoint_error_round_trips_through_pickle():
    from zeropp_hier.deepspeed.checkpoint import HierCheckpointError

    err = HierCheckpointError("/ckpt/global_step3", "missing file", "save again")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and (back.path, back.problem, back.fix) == (err.path, err.problem, err.fix)


def test_untrusted_checkpoint_error_round_trips_through_pickle():
    from zeropp_hier.deepspeed.checkpoint.safe_load import UntrustedCheckpointError, untrusted_problem

    err = UntrustedCheckpointError("/ckpt/t/x.pt", untrusted_problem(["builtins.exec"]))
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is UntrustedCheckpointError and str(back) == str(err) and "trust_pickles" in str(back)
