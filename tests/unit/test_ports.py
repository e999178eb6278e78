"""The rendezvous port ([Note: ports below the ephemeral range] in zeropp_hier/launch/ports.py):
below the kernel's ephemeral range, with room for compare.sbatch's steps, the same from the batch
scripts' shell function as from the package, and a clear refusal where the range leaves no room."""

import socket
import subprocess
from pathlib import Path

import pytest

from zeropp_hier.launch.ports import (
    LINUX_EPHEMERAL_LOW,
    STEP_PORTS,
    ephemeral_low,
    free_port,
    job_port,
    port_window,
)

COMMON = Path(__file__).resolve().parents[2] / "scripts" / "frontier" / "common.sh"
# Linux's default start; one a site might set lower (the IANA dynamic range starts at 49152, some
# set 15000); the smallest start that still leaves 256 ports above 1024
LOWS = [LINUX_EPHEMERAL_LOW, 49152, 15000, 1024 + STEP_PORTS + 256]
JOBS = [0, 1, 123456, 3_000_000, 2**31 - 1]


@pytest.mark.parametrize("low", LOWS)
def test_a_jobs_ports_stay_below_the_range(low):
    base, span = port_window(low)
    assert base >= 1024 and span >= 256
    for job in [*JOBS, *range(span - 3, span + 3)]:
        port = job_port(job, low)
        # the job's port and every step's after it
        assert base <= port and port + STEP_PORTS - 1 < low, (job, low, port)


def test_the_default_start_gives_the_old_base():
    assert port_window() == (20000, LINUX_EPHEMERAL_LOW - STEP_PORTS - 20000)


def test_no_room_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"ip_local_port_range starts at 1200.*MASTER_PORT"):
        job_port(5, 1200)


def _shell_port(job: int, low: int) -> subprocess.CompletedProcess:
    script = f'source "{COMMON}"; zh_master_port {job} {low}'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("low", LOWS)
def test_the_batch_scripts_compute_the_same_port(low):
    for job in JOBS:
        p = _shell_port(job, low)
        assert p.returncode == 0, p.stderr
        assert int(p.stdout) == job_port(job, low)


def test_the_batch_scripts_refuse_too_small_a_range():
    p = _shell_port(5, 1200)
    assert p.returncode != 0 and "ip_local_port_range starts at 1200" in p.stderr and p.stdout == ""


def test_this_hosts_range_is_read(tmp_path):
    # the real file of this machine, where there is one; Linux's default without it
    assert 1024 <= ephemeral_low() <= 65535
    assert ephemeral_low(str(tmp_path / "absent")) == LINUX_EPHEMERAL_LOW
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")  # the file's format: two numbers, tab-separated
    assert ephemeral_low(str(f)) == 40000


def test_a_free_port_is_below_the_range_and_binds():
    low = ephemeral_low()
    base, span = port_window(low)
    seen = set()
    for _ in range(20):
        port = free_port()
        assert base <= port < base + span < low
        seen.add(port)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing held it
    assert len(seen) > 1  # chosen at random, not one fixed port


def test_a_held_port_is_not_returned():
    # hold every port of a small range but the last: a held one is never the answer
    low = 1024 + STEP_PORTS + 256
    base, span = port_window(low)
    held = []
    try:
        for port in range(base, base + span - 1):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        free = free_port(low, tries=5000)
        assert base <= free < base + span and free not in {s.getsockname()[1] for s in held}
    finally:
        for s in held:
            s.close()
