"""The configurations the comparison benchmark can run, as data: stock DeepSpeed's two, our three
presets and ``auto`` (``ORDER``, the default set ``DEFAULT``), and the named variants
(``VARIANTS``) that ``--configs`` picks for one question each (overlap, kept levels, pipelined
hops, gradient schemes, the tick mode). A configuration is what ``benchmarks/compare/rank.py``
builds: ``kind`` stock or ours, and for ours the preset and the ``zeropp_hier`` section's
overrides. ``in_issue_mode`` sets ours to the issue mode of a run ([Note: benchmark issue mode])."""

from __future__ import annotations

from benchmarks.compare.schemes import EXACT_GCD_GRADIENTS, INT4_NODE_GRADIENTS, INT8_GCD_GRADIENTS, INT8_GCD_NODE8

ORDER = ["ds-zero3", "ds-zeropp", "zero3", "zeropp", "frontier", "auto"]
DEFAULT = ORDER[:5]
# variants for the overlap question (name them with --configs): prefetch off, and every
# collective inline (overlap off) with prefetch on
# frontier's whole compression until its node stage became int8 (CHANGELOG)
FRONTIER_INT4_NODE = {"weights": {"node": "int8"}, **INT4_NODE_GRADIENTS}
VARIANTS = {
    "zeropp/no-prefetch": {"kind": "ours", "preset": "zeropp", "prefetch": False},
    "frontier/no-prefetch": {"kind": "ours", "preset": "frontier", "prefetch": False},
    "zeropp/inline": {"kind": "ours", "preset": "zeropp", "overlap": False},
    "frontier/inline": {"kind": "ours", "preset": "frontier", "overlap": False},
    # package copies for about half the layers, node copies for the rest ([Note: kept levels]):
    # the model's package copy is ~1.75 MB per rank in int8 rows, a node copy ~0.44 MB
    "frontier/half": {"kind": "ours", "preset": "frontier", "memory": {"kept_shards_gb": 0.0011}},
    # zeropp (ZeRO++'s flat forward) with package copies for the same layers: their backward
    # stays in the package; and with package copies for every layer (hpZ over the package)
    "zeropp/half": {"kind": "ours", "preset": "zeropp", "memory": {"kept_shards_gb": 0.0011}},
    "zeropp/package": {"kind": "ours", "preset": "zeropp", "memory": {"kept_shards_gb": 1.0}},
    # package copies for half the transformer blocks (blocks.0-1, with the embeddings and ln_f,
    # upgraded in model order; 1.19 of 1.81 MB per rank), node copies for blocks.2-3
    "zeropp/half-blocks": {"kind": "ours", "preset": "zeropp", "memory": {"kept_shards_gb": 0.0012}},
    # pipelined hops ([Note: chunked gathers]): each gather and gradient bucket cut into 4
    # block-aligned chunks, so the lanes run different chunks' hops on different tiers at once
    "frontier/pipe": {"kind": "ours", "preset": "frontier", "pipeline": {"chunks": 4}},
    "zeropp/pipe": {"kind": "ours", "preset": "zeropp", "pipeline": {"chunks": 4}},
    # twice the chunks: less fill and drain per job, more messages (the schedule at link share
    # 0.15: 68.0 s with 4 chunks, 65.3 s with 8)
    "frontier/pipe8": {"kind": "ours", "preset": "frontier", "pipeline": {"chunks": 8}},
    # one chunk, as auto picks it where the links are fast (its host term against zeropp's)
    "frontier/one-chunk": {"kind": "ours", "preset": "frontier", "pipeline": {"chunks": 1}},
    # int4 gradients on the package links (frontier's default until the paired test: fewer bytes
    # where those links bind, +0.36% held-out loss); the runtime comparison with older commits
    "frontier/gpu-int4": {
        "kind": "ours",
        "preset": "frontier",
        "compression": {"gradients": {"gpu": "int4"}},
    },
    # int8 gradients on the package links, int4 on the network (frontier's default before int4 on
    # the package links)
    "frontier/int8-gpu": {
        "kind": "ours",
        "preset": "frontier",
        "compression": {"gradients": {"gcd": "none", "gpu": "int8", "node": "int4"}},
    },
    # pipelined, with int8 gradients on the in-package hop too: in the link-bound regime the
    # backward's gcd lane carries the backward gathers and every gradient in bf16 and binds there
    # while the package links wait ([Note: step schedule] in zeropp_hier/planner/schedule.py)
    "frontier/pipe-int8-gcd": {
        "kind": "ours",
        "preset": "frontier",
        "pipeline": {"chunks": 4},
        "compression": INT8_GCD_GRADIENTS,
    },
    # int8 on the in-package hop beside int4 gpu and int8 node hops: frontier/pipe since this
    # became frontier's default, spelled out
    "frontier/pipe-int8-gcd-node8": {
        "kind": "ours",
        "preset": "frontier",
        "pipeline": {"chunks": 4},
        "compression": INT8_GCD_NODE8,
    },
    # frontier's default before that: the in-package hop exact; unchunked and pipelined
    "frontier/exact-gcd": {"kind": "ours", "preset": "frontier", "compression": EXACT_GCD_GRADIENTS},
    "frontier/pipe-exact-gcd": {
        "kind": "ours",
        "preset": "frontier",
        "pipeline": {"chunks": 4},
        "compression": EXACT_GCD_GRADIENTS,
    },
    # and with the backward's gathers at most one layer ahead, so that each layer's gradients
    # reach the gcd lane before the gathers of the layers after the next ([Note: backward window]
    # in zeropp_hier/deepspeed/inflight.py)
    "frontier/pipe-int8-gcd-w1": {
        "kind": "ours",
        "preset": "frontier",
        "pipeline": {"chunks": 4, "backward_layers_ahead": 1},
        "compression": INT8_GCD_GRADIENTS,
    },
    # int4 gradients on the package links and the network, spelled out (frontier's default
    # before its node stage became int8; the recorded runs below that name it were made when
    # frontier sent int8 on the package links)
    "frontier/int4-gpu": {"kind": "ours", "preset": "frontier", "compression": FRONTIER_INT4_NODE},
    # the tick mode ([Note: ticks] in zeropp_hier/comm/tick/plan.py): one issuing thread and one
    # communicator, as on a GPU, with each job's 4 chunks on different tiers inside one grouped
    # call per tick; the same in either --issue-mode (the configuration names its mode)
    "frontier/ticks": {"kind": "ours", "preset": "frontier", "overlap": "ticks", "pipeline": {"chunks": 4}},
    "zeropp/ticks": {"kind": "ours", "preset": "zeropp", "overlap": "ticks", "pipeline": {"chunks": 4}},
    # the modes a GPU run can also be asked for, named so that they run as named in either
    # --issue-mode: hop after hop on one lane (the GPU default before ticks), and gloo's lanes
    # with the lanes headline's 4 chunks (the concurrency NCCL/RCCL do not allow, for the
    # "GPU mode within 10% of lanes" comparison in one run)
    "frontier/one-lane": {"kind": "ours", "preset": "frontier", "overlap": "one_lane"},
    "zeropp/one-lane": {"kind": "ours", "preset": "zeropp", "overlap": "one_lane"},
    "frontier/lanes": {"kind": "ours", "preset": "frontier", "overlap": "lanes", "pipeline": {"chunks": 4}},
    # ticks in 8 chunks, named (frontier/ticks: 4): the tick mode's default since
    # compare_link_bound_gpu_mode_ticks8.json
    "frontier/ticks8": {"kind": "ours", "preset": "frontier", "overlap": "ticks", "pipeline": {"chunks": 8}},
    # gloo's lanes with the tick mode's default 8 chunks: the default configuration's
    # "GPU mode within 10% of lanes" comparison in one run
    "frontier/lanes8": {"kind": "ours", "preset": "frontier", "overlap": "lanes", "pipeline": {"chunks": 8}},
    # every tick hop in log steps, or every one direct ([Note: log-step hops] in comm/tick/plan.py):
    # the default ("auto") against each forced way, at the issue mode's chunks
    "frontier/log": {"kind": "ours", "preset": "frontier", "pipeline": {"hop_steps": "log"}},
    "frontier/direct": {"kind": "ours", "preset": "frontier", "pipeline": {"hop_steps": "direct"}},
}

# [Note: benchmark issue mode]
# ``benchmarks.compare --issue-mode`` says who issues our hop collectives. ``gpu`` (the default)
# runs every configuration of ours as a GPU backend would: one issuing thread, ``overlap`` "gpu",
# which is ``true`` as NCCL/RCCL resolve it (comm/issue.py): "ticks" where every hop of the
# preset's plan spans one tier, with the tick mode's chunks where the configuration leaves them
# out, and "one_lane" otherwise; a configuration that names its own mode ("ticks", "one_lane",
# false: inline, "lanes") runs it as named.
# ``lanes`` leaves ``overlap`` as the configuration has it, so ``true`` is gloo's per-group
# threads, a mode the GPU backends forbid. Stock DeepSpeed issues its own collectives and is the
# same in both. The mode is recorded as ``plan["issue_mode"]``; a result file written before it was
# recorded ran lanes.
ISSUE_MODES = ("gpu", "lanes")
UNRECORDED_ISSUE_MODE = "lanes"
GPU_OVERLAP = "gpu"  # overlap true as NCCL/RCCL resolve it, on gloo (comm/issue.resolve_issue_mode)


def in_issue_mode(cfg: dict, issue_mode: str) -> dict:
    """A configuration as it runs in ``issue_mode`` ([Note: benchmark issue mode])."""
    if issue_mode not in ISSUE_MODES:
        raise ValueError(f"issue mode {issue_mode!r}: use one of {list(ISSUE_MODES)}")
    if issue_mode == "lanes" or cfg.get("kind") != "ours":
        return cfg
    overlap = cfg.get("overlap", True)
    return {**cfg, "overlap": GPU_OVERLAP if overlap is True else overlap}


def issue_mode_of(plan: dict) -> str:
    """The issue mode a plan ran in (``lanes`` for a file written before it was recorded)."""
    return plan.get("issue_mode", UNRECORDED_ISSUE_MODE)


def issue_mode_label(plan: dict) -> str:
    """The issue mode as every table and the chart name it."""
    mode = plan.get("issue_mode")
    if mode == "gpu":
        return "issue mode gpu (one issuing thread, as NCCL/RCCL)"
    if mode == "lanes":
        return "issue mode lanes (gloo's thread per hop group; not a GPU mode)"
    return "issue mode lanes (recorded before the mode was: gloo's thread per hop group)"


def configs(gcds_per_node: int, stock_quant_ok: bool) -> dict:
    zpp = {"zero_hpz_partition_size": gcds_per_node}
    if stock_quant_ok:
        zpp.update(zero_quantized_weights=True, zero_quantized_gradients=True)
    return {
        "ds-zero3": {"kind": "stock"},
        "ds-zeropp": {"kind": "stock", "zero": zpp},
        "zero3": {"kind": "ours", "preset": "zero3"},
        "zeropp": {"kind": "ours", "preset": "zeropp"},
        "frontier": {"kind": "ours", "preset": "frontier"},
        # chooses at initialize from a probe of these links ([Note: auto preset])
        "auto": {"kind": "ours", "preset": "auto"},
        **VARIANTS,
    }


# What the presets compressed in result files written before the plan recorded it
# ("preset_compression")
UNRECORDED_PRESET_COMPRESSION = {"frontier": FRONTIER_INT4_NODE}
