"""When a peer rank dies or stops: every collective fails within a bound, with a named error.

[Note: failure detection]
A rank that dies (SIGKILL, OOM killer, node failure) or stops (stuck in I/O, a deadlock in user
code) must not leave the rest of a Frontier allocation waiting. Two mechanisms end every wait:

- A peer that *dies* closes its sockets; gloo then fails the pending operation at once with
  "Connection closed by peer" / "Connection reset by peer" (verified on CPU: ~0.1 s).
- A peer that *stops* keeps its sockets open; only a timeout ends the wait. Our hop groups get
  ``collective_timeout_s`` right after creation (``groups.build_hop_groups``; the creation
  itself, a rendezvous paced by the slowest rank's start-up, gets at least
  ``MIN_SETUP_TIMEOUT_S``). DeepSpeed's own groups (its data-parallel group: the gradient-norm
  all-reduce of every step and the checkpoint barriers, on the parameters' ``ds_process_group``,
  which is the default group when ZeRO spans the world) keep the timeout they were created with
  (torch's 30 minutes, or ``init_distributed``'s) unless ``deepspeed_group_timeout_s`` is set;
  then ``bound_groups`` gives them that when the engine is built, until it is destroyed. This
  is deliberate: a first step with long kernel tuning, or a large checkpoint, must not abort a
  healthy job because our hop timeout is short.

Each error names the setting whose timeout ended the wait (``HierCommError.setting``):
``collective_timeout_s`` for our hop groups, ``deepspeed_group_timeout_s`` for DeepSpeed's when
it is set, and DeepSpeed's own timeout (with its value) when it is not.

Either way the failure is re-raised as ``HierCommError``, naming the rank, the phase, the tier
and the peer ranks of the collective it was waiting in. A rank whose exception propagates exits;
its sockets close, so peers blocked on *it* fail at once in turn: the failure spreads through
the world within about one ``collective_timeout_s`` (less when nobody is merely stuck).

A *link* that fails (a node's uplink down in benchmarks/cluster) closes nothing: no FIN or
RST crosses it, so every wait across it ends by the timeout alone, on both sides of the cut, naming
the link's tier and the peers beyond it. A rank waiting in a faster tier on such a rank either sees
it exit (``peer_lost``) or, having started its own wait at about the same moment, times out beside
it and names its own tier and that partner; the partner's error then names the failed tier, so
the timeout reason says that a peer may be cut off. Every rank ends within about
``collective_timeout_s`` + one step + two process exits of the failure (tests/test_netfail.py).

On RCCL/NCCL (not verified here) the same group timeout drives torch's watchdog, which aborts
the process instead of raising; the bound is the same, the message is torch's.
"""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta
from typing import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from ..core.ranks_text import ranks_text
from ..core.topology import Topology
from ..core.vocab import AXES

# gloo's transport messages (torch 2.x) for a lost peer and for a timeout; NCCL raises
# DistBackendError subclasses, matched by type below.
_PEER_LOST = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Connection refused|Socket closed", re.IGNORECASE
)
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_COMM = re.compile(r"gloo|Connection (closed|reset)|Timed out waiting|Broken pipe|c10d", re.IGNORECASE)

_REASONS = {
    "peer_lost": "a peer closed its connection (its process died, or exited after its own failure)",
    "timeout": "no progress within {setting} = {timeout:g} s (a peer is stuck, died "
    "without closing its connection, is cut off by a failed link, or waits on one that is)",
    "error": "the collective raised an error",
}


class HierCommError(RuntimeError):
    """A collective could not complete because a peer rank died, stopped, or failed.

    Attributes name what the rank was doing: ``rank``, ``phase`` (``forward_gather``,
    ``backward_gather``, ``grad_reduce``, ``other_gather``, ``deepspeed step``, ``checkpoint``,
    ...), ``tier`` (the slowest tier the collective spans), ``axes``, ``peers`` (the other
    ranks in it), ``kind`` (``peer_lost``, ``timeout``, ``error``), ``timeout_s`` and
    ``setting`` (the name of the setting that gave the group its timeout).
    """

    def __init__(
        self,
        *,
        rank: int,
        phase: str,
        tier: str,
        axes: Sequence[str],
        peers: Sequence[int],
        kind: str,
        timeout_s: float | None,
        cause: str,
        setting: str = "collective_timeout_s",
    ):
        self.rank, self.phase, self.tier, self.axes = rank, phase, tier, tuple(axes)
        self.peers, self.kind, self.timeout_s, self.cause = tuple(peers), kind, timeout_s, cause
        self.setting = setting
        reason = _REASONS[kind].format(timeout=timeout_s if timeout_s is not None else float("nan"), setting=setting)
        first = cause.strip().splitlines()[0] if cause.strip() else ""
        super().__init__(
            f"zeropp_hier collective failed on rank {rank} in {phase}, tier '{tier}' "
            f"(group over {'+'.join(self.axes)}), waiting on peer ranks {ranks_text(self.peers)}: {reason}. "
            f"This job cannot continue; restart it and resume from the last complete checkpoint "
            f"(engine.load_checkpoint(save_dir) reads 'latest'). Cause: {first}"
        )

    # the keyword-only constructor's fields: a pickled error is rebuilt from them
    # (_rebuild_comm_error), so that it crosses process boundaries whole
    _FIELDS = ("rank", "phase", "tier", "axes", "peers", "kind", "timeout_s", "cause", "setting")

    def __reduce__(self):
        return (_rebuild_comm_error, (type(self), {f: getattr(self, f) for f in self._FIELDS}))


def _rebuild_comm_error(cls, fields: dict) -> HierCommError:
    return cls(**fields)


def classify(exc: BaseException) -> str | None:
    """``peer_lost`` / ``timeout`` / ``error`` for a communication failure, None otherwise."""
    text = str(exc)
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return "timeout" if _TIMEOUT.search(text) else ("peer_lost" if _PEER_LOST.search(text) else "error")
    if not isinstance(exc, RuntimeError) or not _COMM.search(text):
        return None
    if _PEER_LOST.search(text):
        return "peer_lost"
    return "timeout" if _TIMEOUT.search(text) else "error"


def slowest_tier(topo: Topology, axes: Sequence[str]) -> str:
    """The tier a group over ``axes`` is named by: its slowest axis with more than one member."""
    for a in AXES:  # canonical order, slowest first
        if a in axes and topo.axis_size(a) > 1:
            return a
    return axes[0] if axes else "gcd"


@contextlib.contextmanager
def collective_guard(
    *,
    rank: int,
    phase: str,
    tier: str,
    axes: Sequence[str],
    peers: Sequence[int],
    timeout_s: float | None,
    any_runtime_error: bool = True,
    setting: str = "collective_timeout_s",
) -> Iterator[None]:
    """Re-raise a failure of the collective(s) inside as ``HierCommError``.

    ``any_runtime_error``: the block is one collective, so any RuntimeError from it is a
    communication failure. Around larger blocks (a DeepSpeed step) only errors that look like
    transport failures are translated, so that a bug in user code keeps its own exception.
    """
    try:
        yield
    except HierCommError:
        raise
    except RuntimeError as e:
        kind = classify(e)
        if kind is None:
            if not any_runtime_error:
                raise
            kind = "error"
        raise HierCommError(
            rank=rank,
            phase=phase,
            tier=tier,
            axes=axes,
            peers=[p for p in peers if p != rank],
            kind=kind,
            timeout_s=timeout_s,
            cause=str(e),
            setting=setting,
        ) from e


# the name under which a timeout of DeepSpeed's own groups is reported when
# deepspeed_group_timeout_s is not set (they run with the timeout they were created with)
DEEPSPEED_OWN_TIMEOUT = (
    "DeepSpeed's own group timeout (torch's default or init_distributed's; "
    "zeropp_hier.deepspeed_group_timeout_s bounds it)"
)


def world_guard(
    topo: Topology, rank: int, phase: str, timeout_s: float | None, setting: str = "deepspeed_group_timeout_s"
) -> contextlib.AbstractContextManager[None]:
    """Guard for DeepSpeed's own collectives, which span every rank (its data-parallel group);
    ``setting`` names where their timeout came from."""
    return collective_guard(
        setting=setting,
        rank=rank,
        phase=phase,
        tier=slowest_tier(topo, AXES),
        axes=AXES,
        peers=range(topo.world_size),
        timeout_s=timeout_s,
        any_runtime_error=False,
    )


# Creating a group is a rendezvous of every member, paced by the slowest rank's start-up (imports,
# model construction), not a collective that a healthy peer answers at once: it gets a longer bound.
MIN_SETUP_TIMEOUT_S = 300.0


def setup_timeout(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else max(timeout_s, MIN_SETUP_TIMEOUT_S)


def as_timedelta(seconds: float | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


def group_timeout(group: dist.ProcessGroup) -> timedelta | None:
    """The current timeout of a process group's CPU (gloo) or device backend, if readable."""
    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):
            continue
    return None


def set_group_timeout(group: dist.ProcessGroup | None, seconds: float | timedelta) -> timedelta | None:
    """Set the timeout of an existing group (DeepSpeed's, which we do not create); returns the
    previous one so that it can be restored. A torch without ``_set_pg_timeout`` (< 2.3) leaves
    the group as it is and returns None."""
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None or group is None:
        return None
    previous = group_timeout(group)
    setter(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds), group)
    return previous


def bound_groups(
    groups: Iterable[dist.ProcessGroup | None], seconds: float
) -> list[tuple[dist.ProcessGroup, timedelta | None]]:
    """Give each distinct group in ``groups`` the timeout ``seconds``; returns what
    ``restore_groups`` needs to put the previous timeouts back."""
    seen, out = set(), []
    for g in groups:
        if g is None or id(g) in seen:
            continue
        seen.add(id(g))
        out.append((g, set_group_timeout(g, seconds)))
    return out


def restore_groups(saved: Sequence[tuple[dist.ProcessGroup, timedelta | None]]) -> None:
    for group, previous in saved:
        if previous is not None:
            set_group_timeout(group, previous)
