"""Pure description of the emulated cluster: namespaces, links, addresses, rates, commands.

No side effects here: ``ClusterSpec`` turns a shape and per-GCD rates into the exact ``ip`` /
``tc`` command lines that build the emulation, the commands that read its counters, and the
placement of every rank. ``netns.py`` runs them. Keeping this apart lets the tests check the
layout without root and the benchmark and the planner share one source of the rates.

[Note: emulated layout]
One namespace per GPU package (``<p>-n<node>g<gpu>``); the GCD ranks of a package run inside it
and share its one address, so GCD-to-GCD traffic stays on the package's ``lo``
(docs/benchmarks.md#emulated-cluster-notes).
Each node has a switch namespace (``<p>-sw<node>``) whose bridge joins its packages' veths; a core
namespace (``<p>-core``) bridges the switches' uplinks. Everything is one flat subnet, so no
routing is needed. Shaping (tbf) sits on *both* ends of every veth, i.e. on each direction:

    package veth  (pkg  <-> p<gpu>)  : gcds_per_gpu  * gpu  rate  (the package's IF links)
    node uplink   (nic  <-> n<node>) : gcds_per_node * node rate  (the node's NICs)
    package lo                       : gcds_per_gpu  * gcd  rate  (both directions share lo)

A message between packages of one node crosses two package veths; between nodes it also
crosses two node uplinks; so each tier's per-GCD rate is what a GCD gets when all GCDs of its
enclosure send at once, as on Frontier (per-GCD ratios gcd:gpu:node = 200:50:12.5, docs/design.md#hardware-tiers).
Nothing is created in the root namespace: deleting the namespaces removes every veth and qdisc
with them. No interface is named ``up`` (it breaks ``ip link`` parsing, docs/benchmarks.md#emulated-cluster-notes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# Frontier's per-GCD link ratios (docs/design.md#hardware-tiers): 200 : 50 : 12.5 GB/s.
FRONTIER_RATIO = {"gcd": 16.0, "gpu": 4.0, "node": 1.0}
DEFAULT_NODE_MBIT = 10.0  # per GCD; low enough that communication dominates on a 2-core CPU
SUBNET = "10.213.0"  # private test subnet, only ever configured inside our namespaces
PKG_IF, LO_IF, NIC_IF = "pkg", "lo", "nic"


class RankPlace(NamedTuple):
    rank: int
    namespace: str
    address: str
    ifname: str  # GLOO_SOCKET_IFNAME inside the namespace
    local_rank: int  # index among the ranks sharing the namespace


class Link(NamedTuple):
    """One veth pair: end a in namespace a, end b in namespace b, both shaped to ``mbit``."""

    ns_a: str
    if_a: str
    ns_b: str
    if_b: str
    mbit: float
    tier: str


class Egress(NamedTuple):
    """One shaped direction: the interface whose tbf shapes what leaves ``namespace`` through it."""

    namespace: str
    ifname: str
    tier: str  # gcd: a package's lo; gpu: a package veth end; node: a node uplink end
    mbit: float


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 2
    gpus_per_node: int = 2
    gcds_per_gpu: int = 2
    node_mbit: float = DEFAULT_NODE_MBIT  # per GCD, per direction
    gpu_mbit: float = DEFAULT_NODE_MBIT * FRONTIER_RATIO["gpu"]
    gcd_mbit: float = DEFAULT_NODE_MBIT * FRONTIER_RATIO["gcd"]
    prefix: str = "zhc"

    def __post_init__(self):
        for name in ("nodes", "gpus_per_node", "gcds_per_gpu"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ClusterSpec.{name} must be a positive integer, got {v!r}")
        if self.packages > 250:
            raise ValueError(f"{self.packages} packages do not fit the /24 test subnet; use at most 250")
        for name in ("node_mbit", "gpu_mbit", "gcd_mbit"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ClusterSpec.{name} must be positive, got {getattr(self, name)!r}")
        # namespace names must stay short; interface names are fixed and short already
        if not self.prefix.isalnum() or len(self.prefix) > 8:
            raise ValueError(f"prefix must be 1-8 letters/digits, got {self.prefix!r}")

    @classmethod
    def scaled(cls, node_mbit: float = DEFAULT_NODE_MBIT, **kw) -> ClusterSpec:
        """Frontier's per-GCD ratios, scaled so the node tier gets ``node_mbit`` per GCD."""
        return cls(
            node_mbit=node_mbit,
            gpu_mbit=node_mbit * FRONTIER_RATIO["gpu"],
            gcd_mbit=node_mbit * FRONTIER_RATIO["gcd"],
            **kw,
        )

    # -- shape ----------------------------------------------------------------------------------
    @property
    def packages(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.packages * self.gcds_per_gpu

    @property
    def gcds_per_node(self) -> int:
        return self.gpus_per_node * self.gcds_per_gpu

    def per_gcd_mbit(self) -> dict[str, float]:
        return {"gcd": self.gcd_mbit, "gpu": self.gpu_mbit, "node": self.node_mbit}

    # -- names ----------------------------------------------------------------------------------
    def package_ns(self, node: int, gpu: int) -> str:
        return f"{self.prefix}-n{node}g{gpu}"

    def switch_ns(self, node: int) -> str:
        return f"{self.prefix}-sw{node}"

    @property
    def core_ns(self) -> str:
        return f"{self.prefix}-core"

    def namespaces(self) -> list[str]:
        out = [self.core_ns]
        for n in range(self.nodes):
            out.append(self.switch_ns(n))
            out += [self.package_ns(n, g) for g in range(self.gpus_per_node)]
        return out

    def owns(self, namespace: str) -> bool:
        """Whether a namespace name has this spec's prefix (teardown also needs the marker:
        ``netns.is_ours``)."""
        return namespace.startswith(self.prefix + "-")

    @property
    def marker(self) -> str:
        """Written at setup as the alias of each namespace's loopback device: what teardown
        requires before it touches a namespace."""
        return marker_for(self.prefix)

    def address(self, node: int, gpu: int) -> str:
        return f"{SUBNET}.{node * self.gpus_per_node + gpu + 1}"

    # -- placement ------------------------------------------------------------------------------
    def place(self, rank: int) -> RankPlace:
        """Rank = gcd + gcds_per_gpu * (gpu + gpus_per_node * node): zeropp_hier's default map,
        and DeepSpeed's hpZ groups (consecutive ranks) then span exactly one node."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        gcd = rank % self.gcds_per_gpu
        gpu = (rank // self.gcds_per_gpu) % self.gpus_per_node
        node = rank // self.gcds_per_node
        return RankPlace(rank, self.package_ns(node, gpu), self.address(node, gpu), PKG_IF, gcd)

    @property
    def master_address(self) -> str:
        return self.address(0, 0)

    # -- links and commands -----------------------------------------------------------------
    def links(self) -> list[Link]:
        out = []
        for n in range(self.nodes):
            for g in range(self.gpus_per_node):
                out.append(
                    Link(
                        self.package_ns(n, g),
                        PKG_IF,
                        self.switch_ns(n),
                        f"p{g}",
                        self.gcds_per_gpu * self.gpu_mbit,
                        "gpu",
                    )
                )
            out.append(
                Link(self.switch_ns(n), NIC_IF, self.core_ns, f"n{n}", self.gcds_per_node * self.node_mbit, "node")
            )
        return out

    def shaped_egress(self) -> list[Egress]:
        """Every shaped link direction ([Note: link use] in benchmarks/compare/linkuse.py): both ends of
        every veth, and each package's lo (one tbf for both directions)."""
        out = []
        for lk in self.links():
            out += [Egress(lk.ns_a, lk.if_a, lk.tier, lk.mbit), Egress(lk.ns_b, lk.if_b, lk.tier, lk.mbit)]
        for n in range(self.nodes):
            for g in range(self.gpus_per_node):
                out.append(Egress(self.package_ns(n, g), LO_IF, "gcd", self.lo_mbit()))
        return out

    def lo_mbit(self) -> float:
        return self.gcds_per_gpu * self.gcd_mbit

    def setup_commands(self) -> list[list[str]]:
        """Every command, in order, that builds the cluster from nothing."""
        # each namespace is marked as ours the moment it exists ([Note: teardown order] in netns.py)
        cmds: list[list[str]] = []
        for ns in self.namespaces():
            cmds.append(["ip", "netns", "add", ns])
            cmds.append(["ip", "-n", ns, "link", "set", "dev", "lo", "alias", self.marker])
        bridges = [self.core_ns] + [self.switch_ns(n) for n in range(self.nodes)]
        for ns in self.namespaces():
            # IPv6 would add its own chatter (neighbour discovery) to the counters
            cmds.append(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                    *TCP_SYSCTLS,  # [Note: pinned TCP]
                ]
            )
            cmds.append(["ip", "-n", ns, "link", "set", "lo", "up"])
        for ns in bridges:
            cmds.append(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
            cmds.append(["ip", "-n", ns, "link", "set", "br0", "up"])
        for lk in self.links():
            # both ends are created directly inside their namespaces: names need only be
            # unique per namespace, and nothing ever appears in the root namespace
            cmds.append(
                [
                    "ip",
                    "link",
                    "add",
                    lk.if_a,
                    "netns",
                    lk.ns_a,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    lk.if_b,
                    "netns",
                    lk.ns_b,
                ]
            )
            for ns, ifname in ((lk.ns_a, lk.if_a), (lk.ns_b, lk.if_b)):
                cmds.append(tbf_command(ns, ifname, lk.mbit))
                if ns in bridges:
                    cmds.append(["ip", "-n", ns, "link", "set", ifname, "master", "br0"])
                cmds.append(["ip", "-n", ns, "link", "set", ifname, "up"])
        for n in range(self.nodes):
            for g in range(self.gpus_per_node):
                ns = self.package_ns(n, g)
                cmds.append(["ip", "-n", ns, "addr", "add", f"{self.address(n, g)}/24", "dev", PKG_IF])
                cmds.append(["ip", "-n", ns, "link", "set", LO_IF, "mtu", "1500"])
                cmds.append(tbf_command(ns, LO_IF, self.lo_mbit()))
        return cmds

    def uplink(self, node: int) -> Link:
        """Node ``node``'s uplink: end a is its switch's ``nic``, end b the core's ``n<node>``."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node {node} outside 0..{self.nodes - 1}")
        return next(lk for lk in self.links() if lk.tier == "node" and lk.ns_a == self.switch_ns(node))

    def uplink_down_commands(self, node: int) -> list[list[str]]:
        """Take node ``node``'s uplink down ([Note: failing links]): its switch-side end, as a NIC
        or cable failing; the core end loses carrier with it, so both directions stop."""
        lk = self.uplink(node)
        return [["ip", "-n", lk.ns_a, "link", "set", lk.if_a, "down"]]

    def uplink_loss_commands(self, node: int, percent: float) -> list[list[str]]:
        """Drop ``percent`` % of the packets in each direction of node ``node``'s uplink, in front
        of its tbf (which stays as it is) ([Note: failing links])."""
        lk = self.uplink(node)
        return loss_commands(lk.ns_a, lk.if_a, percent) + loss_commands(lk.ns_b, lk.if_b, percent)

    def uplink_clear_loss_commands(self, node: int) -> list[list[str]]:
        lk = self.uplink(node)
        return [clear_loss_command(lk.ns_a, lk.if_a), clear_loss_command(lk.ns_b, lk.if_b)]

    def counter_interfaces(self) -> dict[str, list[tuple[str, str]]]:
        """(namespace, interface) whose tx bytes make up each tier ([Note: wire bytes])."""
        pk = [(self.package_ns(n, g), PKG_IF) for n in range(self.nodes) for g in range(self.gpus_per_node)]
        return {
            "node": [(self.switch_ns(n), NIC_IF) for n in range(self.nodes)],
            "package_out": pk,
            "gcd": [(ns, LO_IF) for ns, _ in pk],
        }


# [Note: wire bytes]
# Bytes per tier come from interface tx counters, identical for stock DeepSpeed and for us:
#   node = sum of the switches' uplink tx (every byte that leaves a node);
#   gpu  = sum of the packages' veth tx minus node (bytes leaving a package but not its node);
#   gcd  = sum of the packages' lo tx (GCD-to-GCD traffic inside a package).
# They include TCP/IP headers and the ACKs of the opposite direction (a few per cent).
MARKER_PREFIX = "zeropp-hier-cluster:"


def marker_for(prefix: str) -> str:
    return MARKER_PREFIX + prefix


def wire_bytes(tx: dict[tuple[str, str], int], spec: ClusterSpec) -> dict[str, int]:
    """Per-tier wire bytes from a {(namespace, interface): tx_bytes} snapshot (or difference)."""
    ifs = spec.counter_interfaces()
    node = sum(tx[k] for k in ifs["node"])
    out_of_packages = sum(tx[k] for k in ifs["package_out"])
    return {"gcd": sum(tx[k] for k in ifs["gcd"]), "gpu": out_of_packages - node, "node": node}


def tbf_command(ns: str, ifname: str, mbit: float) -> list[str]:
    """tbf at ``mbit`` ([Note: small buckets]); the queue holds ~200 ms of traffic, and never
    less than QUEUE_FLOOR_BYTES ([Note: deep queues]), so a collective's bursts are delayed, not
    dropped."""
    rate_bytes = mbit * 1e6 / 8
    burst = max(int(rate_bytes * 0.002), 8 * 1024)
    limit = max(int(rate_bytes * 0.2), QUEUE_FLOOR_BYTES)
    return [
        "tc",
        "-n",
        ns,
        "qdisc",
        "add",
        "dev",
        ifname,
        "root",
        "tbf",
        "rate",
        f"{mbit:g}mbit",
        "burst",
        str(burst),
        "limit",
        str(limit),
    ]


# [Note: small buckets]
# The bucket is ~2 ms of traffic (at least 8 KiB). A bucket of 128 KiB let each per-layer gather
# of a few hundred KB pass half at memory speed after every pause for compute, so links looked
# up to 2x faster than their rate for layouts that send many small messages, and not for the
# large flat ones. Packets larger than the bucket are no problem on veths (tbf splits GSO
# packets into MTU-sized segments); on lo, whose 64 KiB MTU makes real 64 KiB packets that tbf
# would drop, the MTU is lowered to 1500 like the veths'.


# [Note: deep queues]
# At link-bound rates (a few hundred kbit/s to a few Mbit/s per link) 200 ms of traffic is
# less than one message, and the queue used to fall back to a 64 KiB floor. Several TCP flows
# share each shaped link (both GCDs of a package, all eight of a node on its uplink, every hop
# group of a pipelined job), and one burst each overflowed it: at link share 0.15 the probe's
# 64 KiB all-gather dropped packets on every package link and node uplink (`tc -s`: 21-98
# drops per package link, 169 and 303 per uplink) and took a TCP retransmission timeout on the
# in-package link (0.43 s instead of 0.22 s), so the probe read 1.06 of the gcd link's 2.56
# Mbit/s. Frontier's links do not drop a collective's burst (Infinity Fabric is lossless,
# Slingshot has link-level retry and congestion control), so the emulation should not either: the
# floor is 1 MiB, more than the eight flows of an uplink keep in flight (the same probe: no
# drops anywhere). Deep queues delay a small message queued behind a large one, as a busy
# link does.
QUEUE_FLOOR_BYTES = 1 << 20


# [Note: pinned TCP]
# A new network namespace takes the host's TCP congestion control, and the host's choice varies
# (this project's CI machines run BBR; Linux's default is CUBIC), so the emulated links' usable
# rate was the host's, not the cluster's. BBR paces each flow at its estimate of the bottleneck
# and cycles its pacing gain below 1; with collectives that stop between calls it never keeps a
# shaped link full, and slow start after idle (on by default) shrinks each connection's window
# again after every pause for compute. The probe's all-gathers at link share 0.15 (0.12 Mbit/s
# per GCD on the uplink, 0.48 on a package link, 1.92 in-package) read the package links at 76%
# of their tbf rate under BBR, 79% under BBR without the restart, 87% under Reno and 88% under
# Reno without it; the uplink at 75%, 89%, 83% and 85%. Frontier's fabrics keep a bulk
# transfer at line rate, so every namespace gets Reno (loss-based, built into every kernel, and
# the one a namespace may always choose) and keeps its window across idle time. Every
# configuration runs on the same links, so this is the same for the baselines.
TCP_SYSCTLS = ("net.ipv4.tcp_congestion_control=reno", "net.ipv4.tcp_slow_start_after_idle=0")


# [Note: failing links]
# A network that fails rather than a process. ``uplink_down_commands`` sets a node's uplink down:
# nothing is sent back (no RST, no ICMP: it is layer 2), so every TCP connection across it just
# stops, as with a dead NIC or switch port, and only collective_timeout_s can end the wait.
# ``uplink_loss_commands`` makes the uplink lossy. netem, the usual tool, is not built into every
# kernel (this project's CI kernel has neither sch_netem nor act_gact), so the drop is a classic-BPF
# filter in direct-action mode on the interface's clsact egress hook, built from tc alone:
#     A = random u32;  if A >= (1 - p) * 2**32: return TC_ACT_SHOT (drop)  else: return TC_ACT_OK
# It runs before the root qdisc, so the tbf shaping is untouched; it lives inside the namespace
# and goes with it (``clear_loss_command`` removes it earlier). Dropped segments are retransmitted
# by TCP: loss slows a run, it must never change its numbers.
SKF_AD_RANDOM = 0xFFFFF000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM: "ld rand" in classic BPF
TC_ACT_OK, TC_ACT_SHOT = 0, 2


def loss_bytecode(percent: float) -> str:
    """tc's ``bytecode`` string (count, then "code jt jf k" per instruction) of a classic-BPF
    program that returns TC_ACT_SHOT for ``percent`` % of packets, chosen at random."""
    if not 0 < percent <= 100:
        raise ValueError(f"loss percent must be in (0, 100], got {percent!r}")
    threshold = min(int(round((1 - percent / 100) * 2**32)), 2**32 - 1)
    prog = [
        (0x20, 0, 0, SKF_AD_RANDOM),  # ld [rand]           (BPF_LD | BPF_W | BPF_ABS)
        (0x35, 0, 1, threshold),  # jge #threshold, next, pass (BPF_JMP | BPF_JGE | BPF_K)
        (0x06, 0, 0, TC_ACT_SHOT),  # ret #SHOT
        (0x06, 0, 0, TC_ACT_OK),
    ]  # ret #OK
    return ",".join([str(len(prog))] + [f"{c} {jt} {jf} {k}" for c, jt, jf, k in prog])


def loss_commands(ns: str, ifname: str, percent: float) -> list[list[str]]:
    """Drop ``percent`` % of what ``ifname`` sends ([Note: failing links]); ``replace`` keeps it
    idempotent, so the rate can be changed by running it again."""
    return [
        ["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "clsact"],
        [
            "tc",
            "-n",
            ns,
            "filter",
            "replace",
            "dev",
            ifname,
            "egress",
            "pref",
            "1",
            "handle",
            "1",
            "bpf",
            "da",
            "bytecode",
            loss_bytecode(percent),
        ],
    ]


def clear_loss_command(ns: str, ifname: str) -> list[str]:
    return ["tc", "-n", ns, "qdisc", "del", "dev", ifname, "clsact"]
