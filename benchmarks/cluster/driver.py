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
    pass


def run_marked(spec: ClusterSpec, argv: list[str], on_mark: Callable[[str, dict], None] | None = None,
               port: int = 29511, timeout: float = 3600.0, log=sys.stderr) -> tuple[list, dict]:
    """Run ``python argv`` on every rank; return (rank 0's RESULT objects, {label: wire bytes
    since the previous mark}). Rank output other than marks and results goes to ``log``;
    any rank exiting non-zero fails the run (its stderr tail is in the error)."""
    procs = runner.launch(spec, argv, port=port, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    tails: dict[int, list[str]] = {r: [] for r in range(len(procs))}

    def drain(r, stream):
        for line in stream:
            tails[r] = (tails[r] + [line])[-40:]
            if r == 0 or "Error" in line or "Traceback" in line:
                log.write(f"[rank {r}] {line}")

    threads = [threading.Thread(target=drain, args=(r, p.stderr), daemon=True) for r, p in enumerate(procs)]
    for r, p in enumerate(procs[1:], 1):  # ranks > 0 print nothing we need on stdout
        threads.append(threading.Thread(target=drain, args=(r, p.stdout), daemon=True))
    def watchdog():
        # A rank that dies leaves the others blocked in a collective (gloo waits 30 min) and
        # rank 0's stdout open: end them all, which ends the read loop below.
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                netns.end_processes([p.pid for p in procs if p.poll() is None])
                return
            time.sleep(0.5)

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
            elif line.startswith("RESULT "):
                results.append(json.loads(line[7:]))
            else:
                log.write(f"[rank 0] {line}")
            if time.monotonic() > deadline:
                raise RankFailure(f"run exceeded {timeout:.0f} s")
        for p in procs:
            p.wait(timeout=120)
        bad = {r: p.returncode for r, p in enumerate(procs) if p.returncode != 0}
        if bad:
            # the first to fail is the one that exited on its own (not signalled by us)
            r = min(bad, key=lambda k: (bad[k] < 0, k))
            raise RankFailure(f"ranks exited non-zero {bad}; rank {r} said:\n" + "".join(tails[r][-25:]))
        return results, by_label
    finally:
        netns.end_processes([p.pid for p in procs if p.poll() is None])
