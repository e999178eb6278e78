"""Who issues the hop collectives: the executor mode, chosen per communication backend here only.

[Note: one issuing thread on GPUs]
``zeropp_hier.overlap`` takes ``true`` (default), ``"lanes"``, ``"one_lane"``, ``"serial"``, ``"ticks"``,
``"gpu"`` or ``false``;
``resolve_issue_mode`` turns it, the hop groups' backend and the torch build into the mode the
executor runs ([Note: one order of hop collectives] in comm/executor.py):

* gloo: ``true`` means *lanes*, a host thread per hop group. gloo runs a collective on the host
  thread that calls it and keeps each group's order; the lanes then pipeline the hops of
  different jobs, which is what the CPU benchmarks measure.
* NCCL and RCCL: ``true`` means *ticks* (below) where every hop of the plan spans one tier
  (``frontier``'s hops: gcd, gpu, node): one host thread, one communicator, the chunks of a piece
  of work on different tiers at once. A plan with a hop across several tiers (``zero3``'s and
  ``zeropp``'s flat gathers over the world or the node) runs *one lane* (below) instead: the tick
  mode sends a hop's rows point-to-point to every member of its group, so a flat hop puts each
  shard on the slow link once per far member, where the library's own ring crosses it once per
  step (measured on the emulated cluster: ``zeropp`` in ticks moved 3.6x the node bytes of
  ``zeropp`` in one lane and ran 2.5x slower; docs/benchmarks.md). Several communicators are what the GPU
  libraries do not allow from several threads: NCCL kernels wait on the device for their peers,
  so collectives of several communicators must be submitted in one order on every rank, and even
  then several in flight on different streams "might work" but is not guaranteed (NCCL user
  guide, "Using multiple NCCL communicators concurrently",
  https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/communicators.html#using-multiple-nccl-communicators-concurrently;
  the maintainers' advice in https://github.com/NVIDIA/nccl/issues/195 is to use communicators
  in separate epochs). Lanes keep each communicator's order but not the order between them: the
  thread that reaches its launch first differs from rank to rank. RCCL on gfx90a deadlocks with
  two or three communicators in flight even when every rank submits them in one order;
  ``NCCL_LAUNCH_ORDER_IMPLICIT=1`` rescues two communicators but not three
  (https://github.com/ROCm/rccl/issues/2191, open). https://github.com/ROCm/rccl/pull/1600
  (closed) is about RCCL stalls on Frontier at scale or with the aws-ofi-rccl plugin (it proposed
  NCCL_STEPS 16 for the 64-wide wavefront); later in it, its author traced his own application's
  hang to FSDP HYBRID_SHARD communicators driven from several host threads and worked around it
  by synchronising every collective: one application's report, and the same rule as here.
* ``"ticks"``, on any backend (gloo too, so the emulated cluster runs what a GPU runs): one lane,
  and every hop's transfers as point-to-point calls on one communicator of every rank, one
  grouped call (``batch_isend_irecv``: one NCCL/RCCL group call) per tick, the chunks of a piece
  of work on different tiers inside it ([Note: ticks] in comm/tick/plan.py). No host wait: the
  rule above holds because there is only one communicator, and each tick is issued after the
  previous one was waited for. With ``pipeline.chunks`` left out the tick mode cuts every piece
  of work into ``DEFAULT_TICK_CHUNKS`` chunks (``default_chunks``).
* ``"one_lane"``, on any backend: one host thread issues every hop collective on its hop
  group's communicator, in program order, hop after hop; on RCCL (a ROCm build,
  ``torch.version.hip``) also *serial*: the thread issues a collective only once the previous
  one has completed on the device (a host wait on an event before every hop collective), so no
  two communicators have collectives in flight at once. The tiers never overlap in this mode.
* ``"serial"``, on any backend: one lane, serial everywhere (the mode ``"one_lane"`` is on RCCL):
  no two communicators of this package ever have collectives in flight, on CUDA too. For
  measurement (the host time the waits cost, ``serial_wait_s`` in ``zeropp_hier.comm_stats``),
  or to rule out cross-communicator concurrency while chasing a hang. On the CPU (gloo, CPU
  tensors) a collective has completed when its call returns, so there is nothing to wait for
  and it runs as ``"one_lane"``.
* ``"gpu"`` is what ``true`` means on NCCL/RCCL, on any backend (ticks or one lane, by the plan's
  hops), so a CPU run reproduces the GPU's schedule (``benchmarks.compare --issue-mode gpu``).
* ``"lanes"`` asks for the per-group threads anywhere; on NCCL/RCCL it runs, with a warning that
  names the risk. ``false`` runs every job inline on the training thread, one after another.

A backend other than gloo (nccl, or one this module does not know) is treated as a device
library: the safe mode is the default for anything not known to be safe with lanes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, NamedTuple, Sequence

if TYPE_CHECKING:
    pass

OVERLAP_CHOICES = (True, False, "lanes", "one_lane", "serial", "ticks", "gpu")
SAFE_WITH_LANES = ("gloo",)  # backends whose collectives run on the calling host thread


class IssueMode(NamedTuple):
    background: bool  # jobs run on the executor's lanes (False: inline on the caller)
    one_lane: bool  # every hop group on one lane: one host thread issues every hop collective
    serial: bool  # on a device, a collective is issued only after the previous one completed
    reason: str  # why, for the log line at start-up
    warning: str | None = None  # set when the configuration asks for a mode known to be unsafe
    ticks: bool = False  # one lane; each piece of work in ticks on one communicator ([Note: ticks])

    @property
    def name(self) -> str:
        if not self.background:
            return "inline"
        if self.ticks:
            return "ticks"
        return ("one_lane/serial" if self.serial else "one_lane") if self.one_lane else "lanes"

    @property
    def schedule(self) -> str:
        """The mode as the planner lays a step out ([Note: step schedule] in planner/schedule.py):
        "ticks", "lanes", or "one_lane" (inline runs hop after hop, as one lane does)."""
        if self.ticks:
            return "ticks"
        return "lanes" if self.background and not self.one_lane else "one_lane"


def backend_for(backend: str, device_type: str) -> str:
    """The backend that serves ``device_type`` in ``torch.distributed.get_backend``'s answer,
    which is one name ("nccl") or one per device ("cpu:gloo,cuda:nccl")."""
    backend = backend.lower()
    if ":" not in backend:
        return backend
    pairs = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
    return pairs.get(device_type, pairs.get("cuda", next(iter(pairs.values()))))


def one_tier_hops(hop_axes: Iterable[Sequence[str]]) -> bool:
    """Whether every hop spans one tier (one axis): where the tick mode pays off ([Note: one
    issuing thread on GPUs]). Pure."""
    return all(len(axes) == 1 for axes in hop_axes)


def resolve_issue_mode(overlap: bool | str, backend: str, is_hip: bool, one_tier: bool = True) -> IssueMode:
    """The executor mode for ``zeropp_hier.overlap`` = ``overlap`` on hop groups of ``backend``;
    ``one_tier``: every hop of the run's plan spans one tier (``one_tier_hops``), which decides
    what ``true`` means on NCCL/RCCL (pure: [Note: one issuing thread on GPUs])."""
    if not isinstance(overlap, bool) and overlap not in OVERLAP_CHOICES[2:]:  # 1 == True: no ints
        raise ValueError(f"zeropp_hier.overlap = {overlap!r}: use one of {list(OVERLAP_CHOICES)}")
    if overlap is False:
        return IssueMode(False, False, False, "overlap false: every job inline on the training thread")
    device_lib = backend.lower() not in SAFE_WITH_LANES
    library = ("RCCL" if is_hip else "NCCL") if backend.lower() == "nccl" else backend
    if overlap == "serial":  # whatever the backend: what RCCL's one lane is
        return IssueMode(
            True,
            True,
            True,
            f"{library}: one lane, serial, as configured: one host thread issues every hop collective in "
            "program order, each after the previous one completed (no two communicators in flight)",
        )
    gpu_default = overlap == "gpu" or (overlap is True and device_lib)  # "gpu": as on NCCL/RCCL, anywhere
    if overlap == "ticks" or (gpu_default and one_tier):  # gloo measures what a GPU runs
        return IssueMode(
            True,
            True,
            False,
            f"{library}: ticks: one host thread issues one grouped point-to-point call per tick on one "
            "communicator spanning the world; the chunks of a piece of work overlap the tiers inside it",
            ticks=True,
        )
    if overlap == "lanes" or (overlap is True and not device_lib):
        if not device_lib:
            return IssueMode(True, False, False, f"{backend}: a host thread per hop group (lanes)")
        return IssueMode(
            True,
            False,
            False,
            f"{library}: lanes, as configured",
            warning=(
                f'zeropp_hier.overlap = "lanes" on {library}: each hop group\'s collectives are issued '
                "from its own host thread, so collectives of different communicators can reach the "
                "device in a different order on different ranks and deadlock (NCCL user guide, "
                '"Using multiple NCCL communicators concurrently"'
                + (
                    "; on gfx90a RCCL hangs with several communicators in flight even in one order, ROCm/rccl#2191"
                    if is_hip
                    else ""
                )
                + '). Use true (the default) or "one_lane" unless this was measured safe here.'
            ),
        )
    serial = device_lib and is_hip
    why = "one lane: one host thread issues every hop collective in program order"
    if gpu_default:
        why += " (a hop of this plan spans several tiers, which ticks would send point-to-point to every member)"
    if serial:
        why += ", each after the previous one completed (no two communicators in flight)"
    return IssueMode(True, True, serial, f"{library}: {why}")


def check_tick_device(mode: IssueMode, backend: str, device_type: str) -> None:
    """Refuse the tick mode where its transfers cannot run: gloo's point-to-point calls read and
    write host memory only (PyTorch's backend table: no gloo send/recv of GPU tensors), so hop
    groups on gloo with the tensors on a GPU cannot use it. Pure; the same on every rank."""
    from ..core.errors import HierConfigError

    if mode.ticks and backend.lower() == "gloo" and device_type != "cpu":
        raise HierConfigError(
            "zeropp_hier.overlap",
            "ticks",
            f"the tick mode sends point-to-point, which gloo does only for CPU tensors, and this run's "
            f"tensors are on {device_type}: use NCCL/RCCL for {device_type} tensors, or another overlap "
            "mode (true) for gloo on a GPU",
        )


# chunks per piece of work where the tick mode picks them (pipeline.chunks left out): a job of
# three hops in C chunks takes C + 2 ticks, so fill and drain cost 2/C of its slowest hop; at 8
# the emulated link-bound fight ran frontier 1.46x zeropp against 1.35x at 4, busiest link 84%
# against 77% (benchmarks/results/compare_link_bound_gpu_mode_ticks8.json), and a tick of a 20B
# layer still moves megabytes per peer. "preset": "auto" lets the planner choose from probed
# rates instead ([Note: busiest-link bound] in planner/pipeline.py)
DEFAULT_TICK_CHUNKS = 8


def default_chunks(chunks: int | None, mode: IssueMode) -> int:
    """``pipeline.chunks`` as ``mode`` runs it: the configured count, or where it is left out
    ``DEFAULT_TICK_CHUNKS`` in the tick mode and 1 elsewhere (lanes overlap the hops of different
    jobs without chunks; one lane and inline overlap nothing). Pure."""
    if chunks is not None:
        return chunks
    return DEFAULT_TICK_CHUNKS if mode.ticks else 1


def chunks_warning(mode: IssueMode, chunks: int) -> str | None:
    """The start-up warning when ``pipeline.chunks`` > 1 overlaps nothing in ``mode``: on one
    lane (hop by hop) and inline the chunks' hops run one after another, so chunking only adds
    latency ([Note: chunked gathers] in comm/gather.py)."""
    if chunks <= 1 or mode.ticks or (mode.background and not mode.one_lane):
        return None
    return (
        f"zeropp_hier.pipeline.chunks = {chunks} in issue mode {mode.name}: every chunk's hops run "
        "one after another there, so the chunks overlap nothing and only add latency. Use "
        'zeropp_hier.overlap = "ticks" (one communicator, the chunks\' tiers overlapping in one grouped call per '
        "tick, on any backend), or pipeline.chunks = 1."
    )


__all__ = [
    "DEFAULT_TICK_CHUNKS",
    "IssueMode",
    "OVERLAP_CHOICES",
    "default_chunks",
    "one_tier_hops",
    "backend_for",
    "check_tick_device",
    "chunks_warning",
    "resolve_issue_mode",
]
