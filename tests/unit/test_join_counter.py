"""The bounded join by counter ([Note: a bounded join] in launch/rendezvous.py), on a real TCP
store with one thread per rank: every rank returns when all joined; when one never comes, every
rank that did names it; no rank reads more than one key per request while waiting (counted)."""

import socket
import threading

import pytest

from zeropp_hier.core.errors import HierStartupError
from zeropp_hier.launch import rendezvous


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(world: int, ranks: list[int], timeout_s: float) -> dict:
    port, out, stores = _free_port(), {}, {}
    done = threading.Event()

    def one(rank: int) -> None:
        try:
            stores[rank] = rendezvous.join(rank, world, "127.0.0.1", port, timeout_s)
            out[rank] = "ok"
        except HierStartupError as e:
            out[rank] = e
        if rank == 0:
            done.wait(30)  # rank 0's store serves the others until they have read the verdict

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join(60)
    done.set()
    threads[0].join(60)
    return out


def test_every_rank_returns_once_all_joined():
    assert _run(4, [0, 1, 2, 3], 30.0) == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}


def test_a_rank_that_never_joins_is_named_on_every_rank_that_did():
    out = _run(4, [0, 1, 3], 2.0)
    assert set(out) == {0, 1, 3}
    for rank, e in out.items():
        assert isinstance(e, HierStartupError), (rank, e)
        assert "rank 2 of 4 never joined" in str(e) and f"seen from rank {rank}" in str(e)


@pytest.mark.parametrize("world", [3])
def test_waiting_asks_for_one_key_at_a_time(world, monkeypatch):
    from torch.distributed import TCPStore

    asked: list[int] = []
    real_wait, real_check = TCPStore.wait, TCPStore.check

    def wait(self, keys, *a):
        asked.append(len(keys))
        return real_wait(self, keys, *a)

    def check(self, keys):
        asked.append(len(keys))
        return real_check(self, keys)

    monkeypatch.setattr(TCPStore, "wait", wait)
    monkeypatch.setattr(TCPStore, "check", check)
    assert set(_run(world, list(range(world)), 30.0).values()) == {"ok"}
    assert asked and max(asked) == 1
