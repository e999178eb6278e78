"""A real one-node Slurm cluster for the tests: Debian's slurm-wlm, slurmctld + slurmd on this
host, with a private munged, all state under a temporary directory, every daemon started here
in the foreground and stopped by its PID (docs/frontier.md#the-one-node-slurm-test-cluster).

Installs slurm-wlm and munge with apt-get when they are missing (CI runs as root); if that
fails the test fails with the apt output, it is never skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

from zeropp_hier.launch.ports import free_port

PACKAGES = ("slurm-wlm", "munge")


class SlurmError(RuntimeError):
    pass


def ensure_installed() -> None:
    if all(shutil.which(x) for x in ("slurmctld", "slurmd", "munged", "sbatch", "scontrol")):
        return
    if os.geteuid() != 0:
        raise SlurmError(
            "slurm-wlm and munge are not installed and this is not root: run "
            "`apt-get install -y slurm-wlm munge` as root"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", *PACKAGES]):
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if p.returncode != 0:
            raise SlurmError(
                f"`{' '.join(cmd)}` failed (is the Debian mirror reachable?):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
            )


def slurm_conf(host: str, d: Path, ctld_port: int, slurmd_port: int, cpus: int, munge_socket: Path) -> str:
    """slurm.conf of a one-node cluster rooted at ``d`` (pure)."""
    return "\n".join(
        [
            "ClusterName=zeropphier",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd.log",
            # the node declares more CPUs than this machine has (8 tasks on 2 cores)
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "ReturnToService=2",
            # never purge finished jobs: `sbatch --wait` backs off 2 s, 8 s, then 32 s between polls
            # while MinJobAge allows (min_job_age/2 above its interval), so under the default 300 s a
            # job's end can go unseen for up to 32 s; at 0 it polls every 2 s, and the few finished
            # records stay (the tests read them back, e.g. `scontrol show job` after the job)
            "MinJobAge=0",
            "SlurmdTimeout=300",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=8000 State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


class LocalSlurm:
    def __init__(self, root: Path, cpus: int = 8):
        ensure_installed()
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        for sub in ("state", "spool", "munge"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.conf.write_text(slurm_conf(self.host, root, free_port(), free_port(), cpus, self.munge_socket))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / f"{name}.stdout", "w")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def _start(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # a private munged (own key, socket, pid file): nothing shared with a system one
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.root}/munge/munged.pid",
                f"--log-file={self.root}/munge/munged.log",
                f"--seed-file={self.root}/munge/munged.seed",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), 30, "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), 60, "slurmctld")
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait(lambda: self._ok(["sinfo", "-h", "-N", "-o", "%N %T"], self.host), 60, "slurmd registration")
        subprocess.run(
            ["scontrol", "update", f"nodename={self.host}", "state=resume"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        self._wait(lambda: self._ok(["sinfo", "-h", "-N", "-o", "%T"], "idle"), 60, "node idle")

    def _ok(self, cmd: list[str], want: str) -> bool:
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        return p.returncode == 0 and want in p.stdout

    def _wait(self, cond, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise SlurmError(f"{name} exited with {p.returncode} while waiting for {what}:\n{self.logs()}")
            if cond():
                return
            time.sleep(0.5)
        raise SlurmError(f"timed out after {timeout} s waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.stdout")):
            out.append(f"--- {f.name} ---\n" + f.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def render(
        self, script: Path, root: Path, nnodes: int, nodelist: str, cwd: Path, overrides: Sequence[str] = ()
    ) -> str:
        """``script``'s commands as it would run them in a job of ``nnodes`` Frontier nodes
        (``RENDER_ONLY=1``: printed, not run), with this cluster's Slurm config for its queries."""
        env = {
            **os.environ,
            "RENDER_ONLY": "1",
            "SLURM_JOB_ID": "777",
            "SLURM_NNODES": str(nnodes),
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_CONF": str(self.conf),
            "USER": "alice",
            "ZEROPP_HIER_ROOT": str(root),
            "PYTHONPATH": str(root),
            "ZH_ENV_TARBALL": "/lustre/alice/zeropp-hier-env.tar.gz",
        }
        p = subprocess.run(
            ["bash", str(script), *overrides], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
        )
        assert p.returncode == 0, p.stderr
        return p.stdout

    def sbatch_wait(
        self, script: Path, args: list[str], cwd: Path, env: dict, timeout: float, options: Sequence[str] = ()
    ) -> tuple[int, str, str]:
        """Submit, wait for the end of the job; (exit code, job id, job output). ``options``:
        sbatch's own, before the script (they win over its ``#SBATCH`` lines)."""
        out_file = cwd / "job-%j.out"
        cmd = ["sbatch", "--parsable", "--wait", "-D", str(cwd), "-o", str(out_file), *options, str(script), *args]
        p = subprocess.Popen(cmd, env={**self.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            p.kill()
            subprocess.run(["scancel", "--user=root"], env=self.env)
            raise SlurmError(f"job did not finish within {timeout} s:\n{self._job_output(cwd)}\n{self.logs()}") from e
        job = stdout.strip().split(";")[0]
        if not job.isdigit():
            raise SlurmError(f"sbatch failed ({p.returncode}): {stdout}\n{stderr}\n{self.logs()}")
        return p.returncode, job, (cwd / f"job-{job}.out").read_text(errors="replace")

    @staticmethod
    def _job_output(cwd: Path) -> str:
        return "\n".join(f.read_text(errors="replace")[-5000:] for f in cwd.glob("job-*.out"))

    def stop(self) -> None:
        """Stop the daemons this object started, by PID, newest first."""
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
