"""Output files are replaced whole or not at all ([Note: atomic output files] in
zeropp_hier/files.py): a writer killed mid-write leaves the previous file readable, a failure
before the rename leaves no temporary file behind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from zeropp_hier.files import write_atomic, write_json_atomic


def test_writes_and_replaces_with_an_ordinary_files_mode(tmp_path):
    target = tmp_path / "summary.json"
    write_json_atomic(target, {"a": 1}, indent=1)
    assert json.loads(target.read_text()) == {"a": 1}
    write_atomic(target, b"\x00binary")
    assert target.read_bytes() == b"\x00binary"
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "masked", "x")
        plain = tmp_path / "plain"
        with open(plain, "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert (tmp_path / "masked").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masked", "plain", "summary.json"]


def test_an_object_that_cannot_be_written_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    write_json_atomic(target, {"good": True})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    with pytest.raises(UnicodeEncodeError):
        write_atomic(target, "\ud800")  # a lone surrogate cannot be encoded
    assert json.loads(target.read_text()) == {"good": True}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


WRITER = """
import sys
from zeropp_hier.files import write_atomic
big = sys.argv[2] * (8 << 20)
print("ready", flush=True)
while True:
    write_atomic(sys.argv[1], big)
"""


def test_a_writer_killed_mid_write_leaves_a_complete_file(tmp_path):
    """SIGKILL a process that rewrites an 8 MB file in a loop, several times at different
    moments: the file is always one whole version, never a truncated one."""
    target = tmp_path / "probe.json"
    versions = {"A", "B", "C", "D", "E"}
    write_atomic(target, "0" * (8 << 20))
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for i, ch in enumerate(sorted(versions)):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(target), ch], stdout=subprocess.PIPE, env=env)
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(0.05 * (i + 1))  # somewhere inside one of the writes
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        data = target.read_text()
        assert len(data) == 8 << 20 and len(set(data)) == 1 and data[0] in versions | {"0"}
    # temporaries of killed writers may remain (hidden, named after the target); never the target
    assert all(p.name.startswith(".probe.json.") for p in tmp_path.iterdir() if p.name != "probe.json")
