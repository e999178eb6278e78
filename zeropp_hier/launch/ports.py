"""The rendezvous port: from a job's id, or free on this host; below the kernel's ephemeral range.

[Note: ports below the ephemeral range]
The kernel gives every socket bound to port 0, and every outgoing connection, a port from
``net.ipv4.ip_local_port_range`` (Linux's default 32768-60999). srun and slurmstepd listen on such
ports for their task I/O and messages, and every process on the node connects from them. A
rendezvous port inside that range can be taken by one of them between choosing it and rank 0's
bind: this project's Slurm test saw it (rank 0 failed with EADDRINUSE, the other ranks reached
srun's socket, which closed on them). So both ports come from below the range:

- a job's port (``job_port``) is ``20000 + job % span`` with ``span`` ending ``STEP_PORTS`` short
  of the range, since compare.sbatch gives each of its steps the next port. It depends only on the
  job id and the range's start, so every node computes the same one; where the ranks compute it
  themselves (``app/launch.launcher_env``) they use Linux's default start, never their own node's
  setting, which could differ between nodes. The batch scripts compute it once, on the batch host,
  from that host's setting (``zh_master_port`` in scripts/frontier/common.sh, held equal to this
  function by tests/unit/test_ports.py) and export it to every rank.
- a free port (``free_port``: tests and the local world) is a random port of that window that
  binds on this host now.
"""

from __future__ import annotations

import random
import socket

# Linux's default start of the ephemeral range (include/net/tcp.h, sysctl documentation)
LINUX_EPHEMERAL_LOW = 32768
RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
# compare.sbatch: each step of a job takes the job's port + its index
STEP_PORTS = 64
_BASE, _LOW_BASE, _MIN_SPAN = 20000, 1024, 256


def ephemeral_low(path: str = RANGE_FILE) -> int:
    """The first port of this host's ephemeral range (Linux's default where the file is absent)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return LINUX_EPHEMERAL_LOW


def port_window(low: int = LINUX_EPHEMERAL_LOW) -> tuple[int, int]:
    """(first port, count) of the ports a job may take below an ephemeral range starting at ``low``,
    leaving ``STEP_PORTS`` for a job's steps; raises ``ValueError`` naming the setting if too few."""
    base = _BASE if low - STEP_PORTS - _BASE >= _MIN_SPAN else _LOW_BASE
    span = low - STEP_PORTS - base
    if span < _MIN_SPAN:
        raise ValueError(
            f"net.ipv4.ip_local_port_range starts at {low}: fewer than {_MIN_SPAN} ports below it for the "
            "rendezvous; set MASTER_PORT (or ZH_MASTER_PORT for the batch scripts) to a port no process on "
            "the first node uses"
        )
    return base, span


def job_port(job: int, low: int = LINUX_EPHEMERAL_LOW) -> int:
    """A Slurm job's rendezvous port: the same on every node that knows the job id."""
    base, span = port_window(low)
    return base + job % span


def free_port(low: int | None = None, tries: int = 200) -> int:
    """A port below this host's ephemeral range that nothing holds now (tests, the local world).
    A race with another chooser stays possible; with an ephemeral port it was also a race with
    every outgoing connection on the host."""
    base, span = port_window(ephemeral_low() if low is None else low)
    rng = random.SystemRandom()
    for _ in range(tries):
        port = base + rng.randrange(span)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port among {tries} tries in {base}-{base + span - 1} on this host")
