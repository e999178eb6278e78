"""benchmarks/gpu/tick_work.py end to end on the CPU (``--device cpu``): one frontier rank at
Frontier's 48 x 4 x 2 with a toy hidden size runs the runtime's tick-mode jobs for one layer
with the stand-in network, the code path the GPU run takes. No timed assertion: only that the
run's ticks, grouped calls and bytes are the schedule's and the plan's."""

import json
import subprocess
import sys

from benchmarks.cpu import layer_cost as lc
from benchmarks.cpu import tick_work as tw
from zeropp_hier.core.topology import Topology

from .processes import ROOT, cpu_env


def test_cpu_run_ticks_and_bytes_are_the_schedules_and_the_plans(tmp_path):
    out = tmp_path / "tick_work.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu.tick_work", "--device", "cpu", "--hidden", "64", "--reps", "1"]
    p = subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert (r["device"], r["topology"], r["preset"], r["pipeline_chunks"]) == ("cpu", [48, 4, 2], "frontier", 8)
    assert r["chunks_source"] == "the tick mode's default" and r["chunks_plan"] == tw.plan_chunks(48)

    # the share is layer_cost's, and the expectations are the pure schedule's and plan's
    topo = Topology(48, 4, 2)
    numels = lc.neox_layer_numels(64, 256)
    width = lc.shard_elems(numels, topo.world_size, 256)
    assert r["share_elems"] == width and r["layer_params"] == sum(numels)
    ticks = tw.layer_ticks(lc.plan_of("frontier", topo), topo, width, 8)
    codec = tw.codec_bytes(lc.layer_kernels(numels, topo, "frontier", 8).calls)

    for phase in tw.PHASES:
        got = r["phases"][phase]
        assert got["ticks"] == ticks[phase] == r["expected"][phase]["ticks"] > 0, phase
        assert (got["bytes_encoded"], got["bytes_decoded"]) == tuple(codec[phase]), phase
        # every tick one grouped call or more (a 48-member direct exchange is 94 ops > 64: two)
        assert got["grouped_calls"] >= got["ticks"]
        # on a CPU the host's time is the device's
        assert got["host_s_reps"] == got["device_s_reps"] and got["host_over_device"] == 1.0
        assert got["host_ms_per_tick"] > 0 and phase in p.stdout
    # the payloads went over the tiers of each phase's hops: the backward re-gather only gcd
    assert set(r["phases"]["forward_gather"]["wire_payload_bytes"]) == {"node", "gpu", "gcd"}
    assert set(r["phases"]["backward_gather"]["wire_payload_bytes"]) == {"gcd"}
    assert set(r["phases"]["grad_reduce"]["wire_payload_bytes"]) == {"node", "gpu", "gcd"}
    assert r["phases"]["grad_reduce"]["grouped_calls"] > r["phases"]["grad_reduce"]["ticks"]
