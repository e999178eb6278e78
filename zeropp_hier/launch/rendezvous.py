"""Start-up for ranks that a launcher started (srun, torchrun, a test): every rank joins first,
within a bounded wait that names the ranks that never came, and only then is the default process
group made.

[Note: a bounded join]
torch's ``env://`` rendezvous (what ``deepspeed.init_distributed`` uses) waits for every rank
for the whole store timeout (DeepSpeed's: 10 minutes, or ``DEEPSPEED_TIMEOUT``), and then says
only "7/8 clients joined". A rank that died in its first second (an import that hit an
instruction its CPU lacks, a bad path, an out-of-memory node) thus costs the job its whole
timeout, and the error does not say which rank to look at. Here rank 0 hosts the same TCP store
(``MASTER_ADDR:MASTER_PORT``), each rank writes a key of its own in it and adds one to a counter,
and rank 0 waits at most ``join_timeout_s`` for the key the last rank to join sets (a wait inside
the store: no rank polls, and each request names one key whatever the world; the ranks' own keys
are read only to name the missing ones). It then writes one verdict that every rank reads: either all
joined, and the default group is made on that same store (so no second port is used), or the
ranks listed never arrived, and every rank that did raises ``HierStartupError`` naming them. A
rank that cannot reach rank 0's store within the same bound says so (rank 0 is the one missing).

Under ``srun`` the batch scripts also pass ``--kill-on-bad-exit=1``, so a task that exits with an
error ends the step at once; the bounded join is for the ranks such a launcher still leaves
waiting (torchrun without an agent, a hand-rolled launcher, or a rank that never started).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Mapping

from ..core.errors import HierConfigError, HierStartupError
from ..detect import net_plugin

JOIN_TIMEOUT_ENV = "ZEROPP_HIER_JOIN_TIMEOUT_S"
DEFAULT_JOIN_TIMEOUT_S = 600.0  # torch's and DeepSpeed's rendezvous waited this long before
_PREFIX = "zeropp_hier/join/"
_VERDICT = _PREFIX + "verdict"
_COUNT = _PREFIX + "count"  # how many ranks joined
_ALL = _PREFIX + "all"  # set by the rank that joined last
_ACKS = _PREFIX + "acks"  # how many joined ranks read a failed verdict
_POLL_S = 0.1  # rank 0's wait for the acknowledgements of a failed verdict only
_ACK_WAIT_S = 10.0  # rank 0's wait for the joined ranks to read a failed verdict


def join_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """The join bound: ``ZEROPP_HIER_JOIN_TIMEOUT_S`` if set, else 600 s."""
    raw = (os.environ if env is None else env).get(JOIN_TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_JOIN_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise HierConfigError(JOIN_TIMEOUT_ENV, raw, "set a positive number of seconds (or unset it: 600 s)")
    return value


def missing_text(missing: list[int], world: int) -> str:
    """``[3, 7]`` -> "ranks 3, 7 of 8"; long lists are shortened to their first and last ten."""
    shown = [str(r) for r in missing]
    if len(shown) > 20:
        shown = [*shown[:10], "...", *shown[-10:]]
    noun = "rank" if len(missing) == 1 else f"{len(missing)} ranks"
    return f"{noun} {', '.join(shown)} of {world}"


def _verdict(missing: list[int]) -> str:
    return "ok" if not missing else "missing:" + ",".join(map(str, missing))


def _parse_verdict(raw: bytes) -> list[int]:
    text = raw.decode()
    if text == "ok":
        return []
    return [int(r) for r in text.split(":", 1)[1].split(",")]


def _waited(store, key: str, timeout_s: float) -> bool:
    """Wait inside the store for ``key``: True once it is set, False after ``timeout_s``."""
    from torch.distributed import DistStoreError

    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except DistStoreError as exc:
        if "timeout" not in str(exc).lower():
            raise
        return False
    return True


def join(rank: int, world: int, host: str, port: int, timeout_s: float):
    """Every rank: join through rank 0's TCP store, waiting at most ``timeout_s``; returns the
    store (for the default group) or raises ``HierStartupError`` naming the ranks missing."""
    from torch.distributed import TCPStore

    bound = timedelta(seconds=timeout_s)
    hint = (
        f"(the bound is {JOIN_TIMEOUT_ENV}={timeout_s:g} s). Look at those ranks' own logs: "
        "they died or hung before joining"
    )
    try:
        store = TCPStore(host, port, world_size=None, is_master=rank == 0, timeout=bound, wait_for_workers=False)
    except Exception as exc:  # a client that never reached rank 0's store within the bound
        if rank == 0:
            raise HierStartupError(
                f"zeropp_hier start-up: rank 0 could not open the rendezvous store on port {port} ({exc})", []
            ) from exc
        raise HierStartupError(
            f"zeropp_hier start-up: rank {rank} could not reach rank 0's store at {host}:{port} within "
            f"{timeout_s:g} s: rank 0 never joined {hint} ({type(exc).__name__}: {exc})",
            [0],
        ) from exc
    # A join by counter: each rank leaves its own key (read only to name the missing on a
    # failure) and adds one to a counter; the rank that brings it to the world sets one key that
    # rank 0 waits on, and the others wait, inside the store, for the verdict: no rank polls, and
    # no request carries more than one key, whatever the world
    store.set(f"{_PREFIX}{rank}", "1")
    if store.add(_COUNT, 1) == world:
        store.set(_ALL, "1")
    if rank == 0:
        if not _waited(store, _ALL, timeout_s):
            # a miss: one pass over the ranks' keys names the missing ones
            missing = [r for r in range(world) if not store.check([f"{_PREFIX}{r}"])]
        else:
            missing = []
        store.set(_VERDICT, _verdict(missing))
        if missing:
            # The store lives in this process: keep it up until every rank that joined has read
            # the verdict, so that each raises the same named error (bounded: a joined rank
            # acknowledges as soon as its wait returns).
            joined = world - len(missing) - 1
            until = time.monotonic() + _ACK_WAIT_S
            while joined and store.add(_ACKS, 0) < joined and time.monotonic() < until:
                time.sleep(_POLL_S)
    else:
        # Rank 0 decides within its own bound, counted from when it started: wait for that bound
        # plus ours (rank 0 may have started up to one bound after this rank).
        try:
            if not _waited(store, _VERDICT, 2 * timeout_s):
                raise HierStartupError(
                    f"zeropp_hier start-up: rank {rank} joined but rank 0 gave no verdict within "
                    f"{2 * timeout_s:g} s {hint}",
                    [0],
                )
            missing = _parse_verdict(store.get(_VERDICT))
            if missing:
                store.add(_ACKS, 1)
        except HierStartupError:
            raise
        except Exception as exc:  # rank 0's store went away: rank 0 died during start-up
            raise HierStartupError(
                f"zeropp_hier start-up: rank {rank} lost rank 0's store at {host}:{port} during the join "
                f"({type(exc).__name__}: {exc}): rank 0 died during start-up; look at its log",
                [0],
            ) from exc
    if missing:
        raise HierStartupError(
            f"zeropp_hier start-up: {missing_text(missing, world)} never joined within {timeout_s:g} s, "
            f"seen from rank {rank} {hint}",
            missing,
        )
    return store


def init_distributed(backend: str | None, gpus: int, env: Mapping[str, str] | None = None) -> None:
    """For a process a launcher started (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): join
    within the bound ([Note: a bounded join]), make torch's default group on the joined store,
    then let DeepSpeed adopt it (``deepspeed.init_distributed`` finds it made and only wraps it),
    with DeepSpeed's own process-group timeout."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.constants import default_pg_timeout

    env = os.environ if env is None else env
    if gpus:  # before anything waits on the others: a missing plugin is this node's own fault
        wrong = net_plugin.problem(env)  # [Note: the network plugin]
        if wrong:
            raise HierConfigError("NCCL_NET", env.get("NCCL_NET"), wrong)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    store = join(rank, world, host, port, join_timeout_s(env))
    store.set_timeout(default_pg_timeout)  # from here on, collectives' and barriers' bound
    name = backend or ("nccl" if gpus else "gloo")
    kwargs: dict = {}
    if gpus and world > 1:
        # as DeepSpeed does for CUDA (ROCm's torch is "cuda" too): bind the rank's device, so
        # that later groups are split from the default one
        kwargs["device_id"] = torch.device("cuda", int(env.get("LOCAL_RANK", "0")))
    dist.init_process_group(name, store=store, rank=rank, world_size=world, timeout=default_pg_timeout, **kwargs)
    deepspeed.init_distributed(dist_backend=name)
