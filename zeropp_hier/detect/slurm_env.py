"""What a Slurm task knows about its job, from its environment variables. Pure parsing.

Also a tiny command line for the batch scripts (``python -m zeropp_hier.detect.slurm_env hostnames
'frontier[08001-08002]'``), used when ``scontrol`` cannot run (rendering a script off-cluster).
"""

from __future__ import annotations

import re
import sys
from typing import Mapping, NamedTuple

from ..core.errors import HierTopologyError


class SlurmTask(NamedTuple):
    procid: int  # global rank
    localid: int  # rank within the node
    ntasks: int  # tasks of the step
    nnodes: int
    nodeid: int
    tasks_per_node: tuple[int, ...]  # one entry per node of the step
    nodelist: tuple[str, ...]  # host names of the step, in Slurm's order


def expand_hostlist(spec: str) -> tuple[str, ...]:
    """Expand Slurm's compressed host list: ``frontier[08001-08002,08005],login1`` ->
    ``(frontier08001, frontier08002, frontier08005, login1)``; zero padding is kept."""
    out: list[str] = []
    for item in _split_top(spec):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", item)
        if not m:
            if item:
                out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for suffix_host in expand_hostlist(suffix) if "[" in suffix else (suffix,):
            for part in ranges.split(","):
                lo, _, hi = part.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise HierTopologyError("SLURM_JOB_NODELIST", spec, f"cannot read range '{part}'")
                width = len(lo)
                for k in range(int(lo), int(hi or lo) + 1):
                    out.append(f"{prefix}{k:0{width}d}{suffix_host}")
    return tuple(out)


def _split_top(spec: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in spec.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p]


def parse_tasks_per_node(spec: str) -> tuple[int, ...]:
    """``SLURM_TASKS_PER_NODE``: ``8(x2),4`` -> (8, 8, 4)."""
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise HierTopologyError("SLURM_TASKS_PER_NODE", spec, "expected Slurm's form, e.g. '8(x2)' or '4,4'")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(out)


def _int(env: Mapping[str, str], name: str) -> int:
    v = env.get(name)
    if v is None or not re.fullmatch(r"[0-9]+", v.strip()):
        raise HierTopologyError(
            name,
            v,
            "expected a non-negative integer set by Slurm; run the job with srun, or give the topology explicitly",
        )
    return int(v)


def slurm_task(env: Mapping[str, str]) -> SlurmTask | None:
    """The task's placement, or None outside a Slurm job step. Step variables (``SLURM_STEP_*``,
    set by srun) win over job variables, which describe the whole allocation. Refuses a step
    whose variables contradict each other."""
    if "SLURM_PROCID" not in env or ("SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env):
        return None
    ntasks = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
    nnodes = _int(env, "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env else "SLURM_NNODES")
    tpn_var = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    tpn = parse_tasks_per_node(env.get(tpn_var, str(ntasks // max(nnodes, 1))))
    nl_var = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in env else "SLURM_JOB_NODELIST"
    nodelist = expand_hostlist(env.get(nl_var, env.get("SLURM_NODELIST", "")))
    task = SlurmTask(
        _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID"), ntasks, nnodes, _int(env, "SLURM_NODEID"), tpn, nodelist
    )
    if len(tpn) != nnodes:
        raise HierTopologyError(
            tpn_var,
            env.get(tpn_var),
            f"lists {len(tpn)} nodes but the step has "
            f"{nnodes} (SLURM_NNODES); the variables come from different steps",
        )
    if sum(tpn) != ntasks:
        raise HierTopologyError(
            tpn_var,
            env.get(tpn_var),
            f"adds up to {sum(tpn)} tasks but the step has {ntasks}; the variables come from different steps",
        )
    if nodelist and len(nodelist) != nnodes:
        raise HierTopologyError(
            nl_var, env.get(nl_var), f"names {len(nodelist)} hosts but the step has {nnodes} nodes"
        )
    if not (task.procid < ntasks and task.nodeid < nnodes and task.localid < tpn[task.nodeid]):
        raise HierTopologyError(
            "SLURM_PROCID",
            {"SLURM_PROCID": task.procid, "SLURM_NODEID": task.nodeid, "SLURM_LOCALID": task.localid},
            f"outside the step ({ntasks} tasks on {nnodes} nodes)",
        )
    return task


def check_uniform(task: SlurmTask) -> None:
    """Every node must run the same number of tasks: a node is one enclosure of the hierarchy."""
    if len(set(task.tasks_per_node)) > 1:
        raise HierTopologyError(
            "SLURM_TASKS_PER_NODE",
            list(task.tasks_per_node),
            "every node must run the same number of tasks; launch with "
            "--ntasks-per-node=8 (Frontier) or a task count the node count divides",
        )


def visible_devices(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """Device ids this process may use, from ROCR_VISIBLE_DEVICES (set by Slurm's
    --gpus-per-task/--gpu-bind on Frontier), HIP_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES,
    in that order; None when none is set."""
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        v = env.get(name)
        if v is not None and v.strip():
            return tuple(x.strip() for x in v.split(",") if x.strip())
    return None


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "hostnames":
        print("\n".join(expand_hostlist(argv[1])))
        return 0
    print("usage: python -m zeropp_hier.detect.slurm_env hostnames <slurm host list>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
