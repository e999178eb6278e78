"""What a rank process inside the emulated cluster uses to talk to its driver.

[Note: marks]
The driver reads interface counters between phases of a run. Rank 0 prints ``MARK <label>`` on
stdout and blocks on stdin until the driver has taken its snapshot and answered; the other ranks
wait in barriers on both sides, so no rank's collective traffic straddles a snapshot. Results
come back as one ``RESULT <json>`` line from rank 0. ``EVENT <label>`` lines from rank 0 do not
block: the driver acts on them while the ranks run on (a failing link, [Note: failing links]).
"""

from __future__ import annotations

import json
import sys


def mark(label: str) -> None:
    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == 0:
        print(f"MARK {label}", flush=True)
        answer = sys.stdin.readline()
        if not answer:
            raise RuntimeError("driver went away (stdin closed)")
    dist.barrier()


def event(label: str) -> None:
    """Rank 0 tells the driver that ``label`` happened, and goes on at once (no barrier, no
    answer): the driver acts on it (e.g. takes a link down) while the ranks keep running."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print(f"EVENT {label}", flush=True)


def send_result(obj) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


def peak_rss_reset() -> None:
    """Reset this process's peak RSS (VmHWM) so the next reading covers one configuration."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0
