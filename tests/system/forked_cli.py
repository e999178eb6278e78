"""``python -m zeropp_hier ARGS`` as a process forked from the session's preloaded fork server
([Note: preloaded ranks] in zeropp_hier/launch/world.py): the same command in a process of its
own (its own directory, output files, exit status and, for a dry run, its own fake world), without
importing torch, DeepSpeed and the job's model class once more. A fresh interpreter spends about 7
of a 48-node dry run's 21 CPU-seconds on those imports; a forked one finds them done. At least
one run of a command stays a fresh ``python -m zeropp_hier`` process in the test that uses this,
so that the command itself is what is tested there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from zeropp_hier.launch.world import preloading_context


def _main(env: dict[str, str], argv: list[str], cwd: str, out: str, err: str) -> None:
    """In the forked process: the caller's environment, the command's output to its files, its exit
    status as the process's."""
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    code = 1
    try:
        from zeropp_hier.__main__ import main

        code = main(argv)
    except SystemExit as e:  # argparse and Hydra end by SystemExit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # the interpreter's exit would walk the preloaded modules' objects once more
        os._exit(code)


def run(argv: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m zeropp_hier *argv`` in ``cwd``, forked; ``subprocess.run``'s result and timeout.
    The forked process takes this process's whole environment, then ``env``, as a new process would
    inherit it (the fork server's own is the session's at its start)."""
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    args = ({**os.environ, **(env or {})}, argv, str(cwd), str(out), str(err))
    proc = preloading_context().Process(target=_main, args=args)
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise subprocess.TimeoutExpired(["zeropp_hier", *argv], timeout, out.read_text(), err.read_text())
    return subprocess.CompletedProcess(["zeropp_hier", *argv], proc.exitcode, out.read_text(), err.read_text())
