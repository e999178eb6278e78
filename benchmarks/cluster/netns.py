"""Side effects of the emulated cluster: build it, read its counters, tear it down.

Everything here runs the commands ``spec.ClusterSpec`` describes. Teardown finds namespaces by
name prefix and removes only those that carry the mark setup wrote into them, so it also removes
what an earlier run left (a killed driver, a failed setup half-way) and nothing else.

[Note: teardown order]
A namespace that still holds a live process survives ``ip netns delete`` (the name goes, the
namespace and its veths stay while the process lives; docs/benchmarks.md#emulated-cluster-notes).
So teardown first ends every
process inside each namespace by PID (``ip netns pids``: SIGTERM, a grace period, SIGKILL), then
deletes the namespaces, which removes their veths, bridges and qdiscs with them. Finally it checks
that nothing with the prefix is left and says what is, rather than pretending.

A name prefix alone is not ownership: ``--prefix cni`` would match other software's namespaces
(``cni-*`` of container runtimes). Setup marks each namespace the moment it creates it (the
alias of its loopback device, ``zeropp-hier-cluster:<prefix>``, kept by the kernel with the
namespace), and teardown ends processes in and deletes only namespaces with the prefix *and*
that mark; others with the prefix are listed (``foreign``) and left alone, and setup refuses to
build over one. A setup killed between ``ip netns add`` and the mark (two commands) leaves one
unmarked namespace; setup then names it and says to remove it by hand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Iterable

from .spec import ClusterSpec, marker_for


class NotRootError(RuntimeError):
    pass


def root_problem(euid: int | None = None) -> str | None:
    """Why this process cannot build the cluster, or None. Pure given ``euid``."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return (
            f"the emulated cluster needs root (network namespaces, veth, tc); running as uid "
            f"{euid}. Run as root, e.g. `sudo python -m benchmarks.cluster setup`."
        )
    return None


def require_root() -> None:
    problem = root_problem()
    if problem:
        raise NotRootError(problem)


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"command failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr.strip()}")
    return res


def list_namespaces() -> list[str]:
    out = _run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    if not out:
        return []
    return [e["name"] for e in json.loads(out)]


def namespace_pids(ns: str) -> list[int]:
    res = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in res.stdout.split() if x.strip().isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def end_processes(pids: Iterable[int], grace: float = 3.0) -> list[int]:
    """SIGTERM, wait up to ``grace`` seconds, SIGKILL what is left. Returns the pids signalled."""
    pids = [p for p in pids if p != os.getpid()]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return pids


def is_ours(ns: str, prefix: str) -> bool:
    """Whether namespace ``ns`` carries the mark that setup writes for ``prefix``."""
    res = _run(["ip", "-n", ns, "-j", "link", "show", "dev", "lo"], check=False)
    try:
        return json.loads(res.stdout)[0].get("ifalias") == marker_for(prefix)
    except (ValueError, IndexError, KeyError, AttributeError):
        return False


def ours(prefix: str) -> list[str]:
    """Namespaces named ``<prefix>-*`` that setup marked as its own."""
    return [ns for ns in list_namespaces() if ns.startswith(prefix + "-") and is_ours(ns, prefix)]


def foreign(prefix: str) -> list[str]:
    """Namespaces named ``<prefix>-*`` without our mark: never touched."""
    return [ns for ns in list_namespaces() if ns.startswith(prefix + "-") and not is_ours(ns, prefix)]


def leftovers(prefix: str) -> dict[str, list]:
    """What still exists of ours for ``prefix``: marked namespaces, processes inside them,
    root-namespace links."""
    spec_ns = ours(prefix)
    procs = {ns: namespace_pids(ns) for ns in spec_ns}
    links = []
    out = _run(["ip", "-j", "link", "show"], check=False).stdout.strip()
    for e in json.loads(out) if out else []:
        name = e.get("ifname", "")
        if name.startswith(prefix):
            links.append(name)
    return {"namespaces": spec_ns, "processes": [p for ps in procs.values() for p in ps], "links": links}


def teardown(prefix: str) -> dict[str, list]:
    """Remove every namespace (and so every veth, bridge and qdisc) named ``<prefix>-*`` that
    setup marked, after ending the processes inside ([Note: teardown order]). Returns what was
    left of ours (all empty when clean); never raises for things already gone. Namespaces with
    the prefix but without the mark are not touched (``foreign``)."""
    mine = ours(prefix)
    for ns in mine:
        end_processes(namespace_pids(ns))
    for ns in mine:
        _run(["ip", "netns", "delete", ns], check=False)
    return leftovers(prefix)


def setup(spec: ClusterSpec) -> None:
    """Build the cluster; on any failure, remove the half-built one before raising."""
    require_root()
    teardown(spec.prefix)  # an earlier run may have been killed before its teardown
    clash = sorted(set(foreign(spec.prefix)) & set(spec.namespaces()))
    if clash:
        raise RuntimeError(
            f"namespaces {clash} exist but were not created by this tool (no {spec.marker!r} mark): "
            f"choose another --prefix, or, if one is a leftover of a setup killed in its first "
            f"step, remove it with `ip netns delete NAME`"
        )
    try:
        for cmd in spec.setup_commands():
            _run(cmd)
    except BaseException:
        teardown(spec.prefix)
        raise


def unshape(spec: ClusterSpec) -> None:
    """Remove every tbf of the cluster (links run at memory speed; for the CPU-bound pass)."""
    for cmd in spec.setup_commands():
        if cmd[0] == "tc":
            _run(["tc", "-n", cmd[2], "qdisc", "del", "dev", cmd[6], "root"], check=False)


def shape(spec: ClusterSpec) -> None:
    """(Re)install every tbf of the cluster at the spec's rates."""
    for cmd in spec.setup_commands():
        if cmd[0] == "tc":
            _run([*cmd[:4], "replace", *cmd[5:]])


def run_commands(cmds: list[list[str]]) -> None:
    """Run commands that ``spec`` built (e.g. ``ClusterSpec.uplink_down_commands``), in order."""
    for cmd in cmds:
        _run(cmd)


def uplink_down(spec: ClusterSpec, node: int) -> None:
    """Take a node's uplink down, now ([Note: failing links] in spec.py)."""
    run_commands(spec.uplink_down_commands(node))


def uplink_loss(spec: ClusterSpec, node: int, percent: float) -> None:
    """Drop ``percent`` % of the packets in each direction of a node's uplink, from now on."""
    run_commands(spec.uplink_loss_commands(node, percent))


def uplink_clear_loss(spec: ClusterSpec, node: int) -> None:
    run_commands(spec.uplink_clear_loss_commands(node))


def link_is_up(ns: str, ifname: str) -> bool:
    data = json.loads(_run(["ip", "-n", ns, "-j", "link", "show", "dev", ifname]).stdout)
    return "UP" in data[0].get("flags", []) and data[0].get("operstate") != "DOWN"


def tcp_retransmits(spec: ClusterSpec) -> int:
    """TCP segments retransmitted so far, summed over the package namespaces (where the ranks'
    sockets live): how much loss the ranks' connections met."""
    total = 0
    for n in range(spec.nodes):
        for g in range(spec.gpus_per_node):
            text = _run(["ip", "netns", "exec", spec.package_ns(n, g), "cat", "/proc/net/snmp"]).stdout
            rows = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
            total += int(dict(zip(rows[0], rows[1]))["RetransSegs"])
    return total


def tx_bytes(spec: ClusterSpec, counter: str = "bytes") -> dict[tuple[str, str], int]:
    """tx byte counters (``counter="packets"``: packet counters) of every interface that
    ``spec.wire_bytes`` needs."""
    out: dict[tuple[str, str], int] = {}
    wanted = {k for v in spec.counter_interfaces().values() for k in v}
    for ns in sorted({ns for ns, _ in wanted}):
        data = json.loads(_run(["ip", "-n", ns, "-s", "-j", "link", "show"]).stdout)
        for e in data:
            key = (ns, e["ifname"].split("@")[0])
            if key in wanted:
                out[key] = int(e["stats64"]["tx"][counter])
    missing = wanted - out.keys()
    if missing:
        raise RuntimeError(f"interfaces not found (is the cluster set up?): {sorted(missing)}")
    return out


def egress_tx(spec: ClusterSpec) -> dict[tuple[str, str], int]:
    """tx byte counters of every shaped link direction (``spec.shaped_egress``)."""
    wanted = {(e.namespace, e.ifname) for e in spec.shaped_egress()}
    out: dict[tuple[str, str], int] = {}
    for ns in sorted({ns for ns, _ in wanted}):
        for e in json.loads(_run(["ip", "-n", ns, "-s", "-j", "link", "show"]).stdout):
            key = (ns, e["ifname"].split("@")[0])
            if key in wanted:
                out[key] = int(e["stats64"]["tx"]["bytes"])
    missing = wanted - out.keys()
    if missing:
        raise RuntimeError(f"interfaces not found (is the cluster set up?): {sorted(missing)}")
    return out


def qdiscs(spec: ClusterSpec) -> dict[tuple[str, str], str]:
    """Root qdisc kind per (namespace, interface), for checks."""
    out = {}
    for ns in spec.namespaces():
        data = json.loads(_run(["tc", "-n", ns, "-j", "qdisc", "show"]).stdout or "[]")
        for q in data:
            if q.get("root"):
                out[(ns, q["dev"])] = q["kind"]
    return out
