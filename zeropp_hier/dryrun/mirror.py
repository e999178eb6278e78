"""The SPMD mirror: torch.distributed's collectives answered as if every peer had sent what this
rank sent, while one rank of a large job runs alone on the fake process group.

[Note: the SPMD mirror]
PyTorch's fake backend (``"fake"``) returns from every collective at once. It copies an
all-gather's input into each output slot and a reduce-scatter's own chunk into the output, but
leaves an all-reduce's tensor as it was (a sum should be the input times the group), an
object broadcast's buffer unfilled (unpickling it fails) and its point-to-point works never
complete (the tick warm-up waits forever). Code that reads what it received then takes wrong
branches or stops. In an SPMD job every rank runs the same program on its own data, so the one
stand-in that keeps the numbers in range is: every peer sent what this rank sent. Each
collective of ``KINDS`` is answered that way here, in Python, without calling the backend
(``answer_*``, pure on tensors: tests/unit/test_dryrun_mirror.py checks each kind):

- all-gather: the input in every slot; all-reduce and reduce: SUM times the group size, PRODUCT
  to the group size's power, BXOR zero for an even group, AVG / MIN / MAX / BAND / BOR the input;
- reduce-scatter: this rank's chunk of its own input, reduced as an all-reduce;
- all-to-all: every slot holds the chunk this rank would send to itself;
- broadcast, scatter, object broadcast and object scatter from another rank: this rank's own
  buffer or list is left as it was (it cannot hold the source's object: ``LIMITS``);
- object all-gather and gather: this rank's object in every slot (the same object, not copies),
  never pickled into the world-sized buffer torch would allocate; its size is counted instead;
- a grouped point-to-point call: each receive gets what this rank sends to the same peer with
  the same tag (a symmetric exchange), else what it sends anywhere with the same tag and shape;
  a receive with no such send keeps its buffer and is counted as unmatched.

Group creation takes the GPU path (``comm/groups.py``'s ``SPLIT``, [Note: groups at scale]): a
Frontier job splits its hop groups from the default group, one call per hop axes, while on the
CPU torch cannot split and a job enters ``new_group`` once per group of the world (56,456 calls
for ``frontier`` at 9,408 nodes, whose host time no rank of a GPU job pays). Each
``split_group`` is answered by ``new_group`` of this rank's own group only (the fake backend has
no rendezvous for the other members to join), counted as one ``split_group`` collective.

Every call is counted by ``meters.Meters`` (kind, bytes) and timed: the host seconds of the
answers (filling every slot of a gather, scaling a sum, copying each receive from its send)
are the harness standing in for the peers and the wire, reported beside each phase's seconds
(which include them) as ``mirror_seconds``. The functions are replaced in
``torch.distributed``, ``distributed_c10d`` and every module's ``from torch.distributed import``
copy (``comm/foreign.rebind``), and in DeepSpeed's communication backend if it exists; direct
``ProcessGroup`` method calls and functional collectives still reach the fake backend. Each
replacement carries ``zeropp_mirror = True`` (the tick warm-up reads it: the peer number it
checks cannot be mirrored).
"""

from __future__ import annotations

import pickle
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ..comm.foreign import rebind

# what the mirror cannot stand in for (printed in every report)
LIMITS = (
    "another rank's object or tensor in a broadcast or scatter from it (this rank keeps its own)",
    "a peer's own number or data: every peer is taken to send what this rank sends (a check of a "
    "peer's identity, such as the tick warm-up's, is skipped)",
    "receives with no matching send in the same grouped call (their buffers are left as they were)",
    "calls made on a ProcessGroup object directly or through torch's functional collectives "
    "(answered by the fake backend: all-gathers correct, reductions not scaled)",
    "wire and link time, other ranks' timing and skew, device kernels when run on CPUs",
    "torch's own split of a group (its walk over the parent's ranks, the communicator split): each "
    "split_group is answered by a new_group of this rank's own group",
)

REDUCE_SAME = {"avg", "min", "max", "band", "bor"}


class Done(dist.Work):
    """A completed work, returned for ``async_op=True`` and point-to-point calls."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


def _op_name(op: Any) -> str:
    if op is None:
        return "sum"
    name = getattr(op, "name", None) or str(op)
    return str(name).split(".")[-1].lower()


def reduce_as_mirror(t: torch.Tensor, op: Any, size: int) -> None:
    """``t`` reduced over ``size`` ranks that all hold ``t`` (in place)."""
    name = _op_name(op)
    if name == "sum" or name == "premul_sum":
        if t.dtype == torch.bool:
            return
        t.mul_(size)
    elif name == "product":
        if t.dtype != torch.bool:
            t.pow_(size)
    elif name == "bxor":
        if size % 2 == 0:
            t.zero_()
    elif name not in REDUCE_SAME:
        raise ValueError(f"zeropp_hier dry run: reduce op {name!r} has no mirror")


def answer_all_gather_into(out: torch.Tensor, inp: torch.Tensor, size: int) -> None:
    out.view(size, -1).copy_(inp.reshape(1, -1).expand(size, -1))


def answer_reduce_scatter(out: torch.Tensor, inp: torch.Tensor, size: int, me: int, op: Any) -> None:
    out.copy_(inp.reshape(size, -1)[me].view_as(out))
    reduce_as_mirror(out, op, size)


def answer_all_to_all_single(
    out: torch.Tensor, inp: torch.Tensor, size: int, me: int, out_splits: Any = None, in_splits: Any = None
) -> None:
    if not out_splits and not in_splits:
        out.view(size, -1).copy_(inp.reshape(size, -1)[me].reshape(1, -1).expand(size, -1))
        return
    rows_in = list(in_splits) if in_splits else [inp.shape[0] // size] * size
    rows_out = list(out_splits) if out_splits else [out.shape[0] // size] * size
    mine = inp.split(rows_in)[me]
    for slot, n in zip(out.split(rows_out), rows_out):
        if n == mine.shape[0]:
            slot.copy_(mine)


def answer_p2p(ops: Sequence[Any]) -> tuple[int, int]:
    """Fill each receive of a grouped call from this rank's sends; (matched, unmatched)."""
    sends = [op for op in ops if _is_send(op)]
    matched = unmatched = 0
    for op in ops:
        if _is_send(op):
            continue
        t = op.tensor
        tag = getattr(op, "tag", 0)
        src = next((s for s in sends if s.peer == op.peer and s.tag == tag and s.tensor.shape == t.shape), None)
        if src is None:
            src = next((s for s in sends if s.tag == tag and s.tensor.shape == t.shape), None)
        if src is None:
            unmatched += 1
            continue
        t.copy_(src.tensor)
        matched += 1
    return matched, unmatched


def _is_send(op: Any) -> bool:
    return getattr(op.op, "__name__", "") in ("isend", "send")


def _nbytes(t: Any) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _size(group: Any) -> int:
    return dist.get_world_size(group)


def _grank(group: Any) -> int:
    return dist.get_rank(group)


def _group_rank_of(group: Any, global_rank: int) -> int:
    if group is None or group is dist.GroupMember.WORLD:
        return global_rank
    return dist.get_group_rank(group, global_rank)


def _pickled(obj: Any) -> int:
    try:
        return len(pickle.dumps(obj))
    except Exception:  # noqa: BLE001 - an unpicklable object would fail torch's call too; counted as 0
        return 0


class Mirror:
    """The replacements, bound to one ``meters.Meters``; ``install`` puts them in place."""

    def __init__(self, meters: Any) -> None:
        self.meters = meters
        self.undo: list[tuple[Any, str, Any]] = []
        self.cdb_undo: list[tuple[Any, str, Any]] = []

    # -- tensor collectives ------------------------------------------------------------------
    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        reduce_as_mirror(tensor, op, _size(group))
        return self._done("all_reduce", _nbytes(tensor), async_op)

    def all_reduce_coalesced(self, tensors, op=None, group=None, async_op=False):
        for t in tensors:
            reduce_as_mirror(t, op, _size(group))
        return self._done("all_reduce", _nbytes(tensors), async_op)

    def reduce(self, tensor, dst=None, op=None, group=None, async_op=False, group_dst=None):
        if dst is not None and dst == dist.get_rank() or group_dst is not None and group_dst == _grank(group):
            reduce_as_mirror(tensor, op, _size(group))
        return self._done("reduce", _nbytes(tensor), async_op)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        for t in tensor_list:
            t.copy_(tensor)
        return self._done("all_gather", _nbytes(tensor_list), async_op)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        answer_all_gather_into(output_tensor, input_tensor, _size(group))
        return self._done("all_gather", _nbytes(output_tensor), async_op)

    def all_gather_coalesced(self, output_tensor_lists, input_tensor_list, group=None, async_op=False):
        for outs, t in zip(output_tensor_lists, input_tensor_list):
            for o in outs:
                o.copy_(t)
        return self._done("all_gather", _nbytes([o for outs in output_tensor_lists for o in outs]), async_op)

    def reduce_scatter_tensor(self, output, input, op=None, group=None, async_op=False):
        answer_reduce_scatter(output, input, _size(group), _grank(group), op)
        return self._done("reduce_scatter", _nbytes(input), async_op)

    def reduce_scatter(self, output, input_list, op=None, group=None, async_op=False):
        output.copy_(input_list[_grank(group)])
        reduce_as_mirror(output, op, _size(group))
        return self._done("reduce_scatter", _nbytes(input_list), async_op)

    def all_to_all_single(
        self, output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False
    ):
        answer_all_to_all_single(output, input, _size(group), _grank(group), output_split_sizes, input_split_sizes)
        return self._done("all_to_all", _nbytes(input), async_op)

    def all_to_all(self, output_tensor_list, input_tensor_list, group=None, async_op=False):
        mine = input_tensor_list[_grank(group)]
        for o in output_tensor_list:
            if o.shape == mine.shape:
                o.copy_(mine)
        return self._done("all_to_all", _nbytes(input_tensor_list), async_op)

    def broadcast(self, tensor, src=None, group=None, async_op=False, group_src=None):
        return self._done("broadcast", _nbytes(tensor), async_op)

    def scatter(self, tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
        if scatter_list and (src == dist.get_rank() or group_src == _grank(group)):
            tensor.copy_(scatter_list[_grank(group)])
        return self._done("scatter", _nbytes(tensor), async_op)

    def gather(self, tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
        for t in gather_list or ():
            t.copy_(tensor)
        return self._done("gather", _nbytes(tensor), async_op)

    def barrier(self, group=None, async_op=False, device_ids=None):
        return self._done("barrier", 0, async_op)

    def monitored_barrier(self, group=None, timeout=None, wait_all_ranks=False):
        self.meters.collective("barrier", 0)

    # -- point to point ------------------------------------------------------------------------
    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        self.meters.collective("p2p", _nbytes(tensor))

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None):
        self.meters.collective("p2p", _nbytes(tensor))
        self.meters.unmatched(1)
        return src if src is not None else 0

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        self.meters.collective("p2p", _nbytes(tensor))
        return Done()

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None):
        self.meters.collective("p2p", _nbytes(tensor))
        self.meters.unmatched(1)
        return Done()

    def batch_isend_irecv(self, p2p_op_list):
        _, unmatched = answer_p2p(p2p_op_list)
        self.meters.unmatched(unmatched)
        self.meters.collective("p2p", sum(_nbytes(op.tensor) for op in p2p_op_list if _is_send(op)))
        return [Done()]

    # -- object collectives --------------------------------------------------------------------
    def all_gather_object(self, object_list, obj, group=None):
        n = _pickled(obj)
        for i in range(len(object_list)):
            object_list[i] = obj
        self.meters.object_collective("all_gather_object", n, n * _size(group))

    def gather_object(self, obj, object_gather_list=None, dst=None, group=None, group_dst=None):
        n = _pickled(obj)
        for i in range(len(object_gather_list or ())):
            object_gather_list[i] = obj
        self.meters.object_collective("gather_object", n, n * (_size(group) if object_gather_list else 1))

    def broadcast_object_list(self, object_list, src=None, group=None, device=None, group_src=None):
        n = _pickled(object_list)
        mine = src == dist.get_rank() if src is not None else group_src == _grank(group)
        if not mine:
            self.meters.foreign_object()
        self.meters.object_collective("broadcast_object_list", n, n)

    def scatter_object_list(
        self, scatter_object_output_list, scatter_object_input_list=None, src=None, group=None, group_src=None
    ):
        if scatter_object_input_list and (src == dist.get_rank() or group_src == _grank(group)):
            scatter_object_output_list[0] = scatter_object_input_list[_grank(group)]
        else:
            self.meters.foreign_object()
        n = _pickled(scatter_object_output_list[0])
        self.meters.object_collective("scatter_object_list", n, n)

    def send_object_list(self, object_list, dst=None, group=None, device=None, group_dst=None):
        n = _pickled(object_list)
        self.meters.object_collective("send_object_list", n, n)

    def recv_object_list(self, object_list, src=None, group=None, device=None, group_src=None):
        self.meters.foreign_object()
        self.meters.object_collective("recv_object_list", 0, 0)
        return src if src is not None else 0

    # -- group creation as on GPUs --------------------------------------------------------------
    def split_group(
        self, parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None, backend=None
    ):
        """torch's ``split_group`` (every rank of ``parent_pg`` enters with the same partition
        ``split_ranks``, in the parent's ranks): this rank's group made on the fake backend, or
        None where the partition leaves it out, as torch returns."""
        if not split_ranks:
            raise ValueError("split_ranks cannot be None or empty")
        parent = None if parent_pg is None or parent_pg is dist.GroupMember.WORLD else parent_pg
        me = dist.get_rank(parent)
        mine = next((m for m in split_ranks if me in m), None)
        self.meters.collective("split_group", 0)
        if mine is None:
            return None
        members = sorted(mine if parent is None else (dist.get_global_rank(parent, r) for r in mine))
        # this rank's group alone: no other member calls here to meet it
        return dist.new_group(ranks=members, timeout=timeout, use_local_synchronization=True, group_desc=group_desc)

    # -- installing ------------------------------------------------------------------------------
    def _done(self, kind: str, nbytes: int, async_op: bool) -> Done | None:
        self.meters.collective(kind, nbytes)
        return Done() if async_op else None

    def install(self) -> None:
        """Replace torch.distributed's functions (once; ``uninstall`` puts them back)."""
        import torch.distributed.distributed_c10d as c10d

        wrappers: dict[int, tuple[Callable[..., object], Callable[..., object]]] = {}
        for name in (*KINDS, *ALIASES):
            real = getattr(c10d, name, None)
            if real is None or getattr(real, "zeropp_mirror", False):
                continue
            mine = getattr(self, ALIASES.get(name, name))

            def bound(*args: Any, _f: Callable = mine, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _f(*args, **kwargs)
                finally:
                    self.meters.mirrored(time.perf_counter() - t0)

            bound.zeropp_mirror = True  # type: ignore[attr-defined]
            bound.__name__ = name
            bound.__wrapped__ = real  # type: ignore[attr-defined]
            wrappers[id(real)] = (real, bound)
        self.undo = rebind(wrappers)
        self._patch_deepspeed()
        self._groups_as_on_gpus()

    def _groups_as_on_gpus(self) -> None:
        """``comm/groups.py`` splits, as where a device is bound ([Note: groups at scale])."""
        from ..comm import groups

        if getattr(dist.split_group, "zeropp_mirror", False):
            return

        def split(*args: Any, **kwargs: Any) -> Any:
            return self.split_group(*args, **kwargs)

        split.zeropp_mirror = True  # type: ignore[attr-defined]
        self.undo += [(dist, "split_group", dist.split_group), (groups, "creation_mode", groups.creation_mode)]
        dist.split_group = split
        groups.creation_mode = lambda: groups.SPLIT

    def _patch_deepspeed(self) -> None:
        """DeepSpeed's backend keeps its gather and reduce-scatter functions as attributes."""
        try:
            import deepspeed.comm.comm as ds_comm
        except ImportError:
            return
        cdb = getattr(ds_comm, "cdb", None)
        if cdb is None:
            return
        for attr in ("all_gather_function", "reduce_scatter_function"):
            real = getattr(cdb, attr, None)
            if real is not None and not getattr(real, "zeropp_mirror", False):
                self.cdb_undo.append((cdb, attr, real))
                name = getattr(real, "__name__", "")
                kind = "all_gather_into_tensor" if "gather" in name else "reduce_scatter_tensor"
                setattr(cdb, attr, getattr(dist, kind))

    def uninstall(self) -> None:
        for mod, attr, real in [*self.undo, *self.cdb_undo]:
            setattr(mod, attr, real)
        self.undo, self.cdb_undo = [], []


KINDS = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "scatter",
    "gather",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)
# torch's other names for the same collectives
ALIASES = {
    "_all_gather_base": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "all_gather_single": "all_gather_into_tensor",  # torch 2.13's name (comm/collectives.py uses it)
    "reduce_scatter_single": "reduce_scatter_tensor",
}

__all__ = ["KINDS", "LIMITS", "Done", "Mirror", "answer_p2p", "reduce_as_mirror"]
