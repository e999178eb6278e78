"""The driver side of [Note: marks]: run ranks, snapshot counters at each mark, collect results."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Callable

from . import netns, runner
from .spec import ClusterSpec, wire_bytes


class RankFailure(RuntimeError):
    """Some rank exited non-zero. ``returncodes`` (negative: killed by that signal), ``tails`` (the
    last lines each rank wrote on stderr), ``exit_at`` (``time.monotonic()`` when the driver saw
    each rank end) and ``killed`` (ranks the driver ended itself) say what every rank did."""

    def __init__(
        self,
        message: str,
        returncodes: dict | None = None,
        tails: dict | None = None,
        exit_at: dict | None = None,
        killed: list | None = None,
    ):
        super().__init__(message)
        self.returncodes, self.tails = returncodes or {}, tails or {}
        self.exit_at, self.killed = exit_at or {}, killed or []


def run_marked(
    spec: ClusterSpec,
    argv: list[str],
    on_mark: Callable[[str, dict], None] | None = None,
    port: int = 29511,
    timeout: float = 3600.0,
    log=sys.stderr,
    on_event: Callable[[str], None] | None = None,
    failure_grace_s: float = 0.0,
    extra_env: dict | None = None,
) -> tuple[list, dict]:
    """Run ``python argv`` on every rank; return (rank 0's RESULT objects, {label: wire bytes
    since the previous mark}). Rank output other than marks, events and results goes to ``log``;
    any rank exiting non-zero fails the run (its stderr tail is in the error).

    ``on_event(label)`` runs when rank 0 prints ``EVENT <label>`` (``rankside.event``), while the
    ranks go on: to disturb the network at a chosen point of a run. ``failure_grace_s``: after a
    rank fails, the others are ended once no rank has ended for this long (0: at once); a test
    that wants to see every rank end on its own gives them the time their own timeouts need."""
    procs = runner.launch(
        spec,
        argv,
        port=port,
        extra_env=extra_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    tails: dict[int, list[str]] = {r: [] for r in range(len(procs))}

    def drain(r, stream):
        for line in stream:
            tails[r] = (tails[r] + [line])[-40:]
            if r == 0 or "Error" in line or "Traceback" in line:
                log.write(f"[rank {r}] {line}")

    threads = [threading.Thread(target=drain, args=(r, p.stderr), daemon=True) for r, p in enumerate(procs)]
    for r, p in enumerate(procs[1:], 1):  # ranks > 0 print nothing we need on stdout
        threads.append(threading.Thread(target=drain, args=(r, p.stdout), daemon=True))
    exit_at: dict[int, float] = {}
    killed: list[int] = []

    def watchdog():
        # A rank that dies leaves the others blocked in a collective (gloo waits 30 min) and
        # rank 0's stdout open: end them all (after the grace), which ends the read loop below.
        while True:
            now = time.monotonic()
            for r, p in enumerate(procs):
                if r not in exit_at and p.poll() is not None:
                    exit_at[r] = now
            if len(exit_at) == len(procs):
                return
            failed = any(procs[r].returncode != 0 for r in exit_at)
            if failed and now - max(exit_at.values()) >= failure_grace_s:
                live = [r for r in range(len(procs)) if r not in exit_at]
                killed.extend(live)
                netns.end_processes([procs[r].pid for r in live])
                for r in live:
                    procs[r].wait()
                    exit_at.setdefault(r, time.monotonic())
                return
            time.sleep(0.1)

    threads.append(threading.Thread(target=watchdog, daemon=True))
    for t in threads:
        t.start()
    results, by_label = [], {}
    last = netns.tx_bytes(spec)
    deadline = time.monotonic() + timeout
    try:
        for line in procs[0].stdout:
            if line.startswith("MARK "):
                label = line[5:].strip()
                now = netns.tx_bytes(spec)
                by_label[label] = wire_bytes({k: now[k] - last[k] for k in now}, spec)
                last = now
                if on_mark:
                    on_mark(label, by_label[label])
                procs[0].stdin.write("go\n")
                procs[0].stdin.flush()
            elif line.startswith("EVENT "):
                if on_event:
                    on_event(line[6:].strip())
            elif line.startswith("RESULT "):
                results.append(json.loads(line[7:]))
            else:
                log.write(f"[rank 0] {line}")
            if time.monotonic() > deadline:
                raise RankFailure(f"run exceeded {timeout:.0f} s")
        for p in procs:
            p.wait(timeout=120 + failure_grace_s)
        for t in threads:  # the watchdog has the exit times; the drains have the last lines
            t.join(timeout=10)
        bad = {r: p.returncode for r, p in enumerate(procs) if p.returncode != 0}
        if bad:
            # the first to fail is the one that exited on its own (not signalled by us)
            r = min(bad, key=lambda k: (bad[k] < 0, k))
            raise RankFailure(
                f"ranks exited non-zero {bad}; rank {r} said:\n" + "".join(tails[r][-25:]),
                returncodes={i: p.returncode for i, p in enumerate(procs)},
                tails={i: "".join(t) for i, t in tails.items()},
                exit_at=dict(exit_at),
                killed=sorted(killed),
            )
        return results, by_label
    finally:
        netns.end_processes([p.pid for p in procs if p.poll() is None])
