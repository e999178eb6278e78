"""docs/gpu.md's tables from the one H100 session: the CUDA kernels' bandwidth as a share of a
device copy (gpu_kernels.json, at 64M and 256M elements) and the engine on CUDA tensors beside
stock ZeRO-3 (gpu_engine.json: the largest relative loss and absolute weight differences)."""

from __future__ import annotations

from . import fmt, sources

KERNELS = f"{sources.RESULTS}/gpu_kernels.json"
ENGINE = f"{sources.RESULTS}/gpu_engine.json"
SIZES = (1 << 26, 1 << 28)
OPS = {
    "quantize": "quantize",
    "dequantize": "dequantize",
    "dequantize_sum(k=4)": "dequantize_sum",
    "dequantize_sum_requantize(k=4)": "dequantize_sum_requantize",
}
CONFIGS = {
    "zero3": "`zero3`, no compression",
    "frontier_exact": "`frontier`, no compression",
    "frontier": "`frontier` (the run's default compression)",
    "zeropp": "`zeropp` (default int8/int4)",
}


def kernels() -> str:
    rows = sources.load(KERNELS)["rows"]
    at = {(r["op"], r["dtype"], r["bits"], r["numel"]): r["pct_of_copy"] for r in rows}
    cols = [("float32", 8), ("float32", 4), ("bfloat16", 8), ("bfloat16", 4)]
    header = ["op", "fp32 int8 64M / 256M", "fp32 int4", "bf16 int8", "bf16 int4"]
    body = [
        [label] + [" / ".join(f"{at[op, dt, b, n]:.0f}%" for n in SIZES) for dt, b in cols]
        for op, label in OPS.items()
    ]
    return fmt.table(header, body) + "\n" + sources.cite([KERNELS]) + "\n"


def engine() -> str:
    parity = sources.load(ENGINE)["parity"]

    def cell(key: str) -> str:
        p = parity[key]
        return f"{fmt.sci(p['max_rel_loss_diff_vs_stock'])} / {fmt.sci(p['max_abs_weight_diff_vs_stock'])}"

    header = ["config", "fp32: max rel. loss diff / max weight diff vs stock", "bf16: same"]
    body = [[label, cell(f"{k}_fp32"), cell(f"{k}_bf16")] for k, label in CONFIGS.items()]
    return fmt.table(header, body) + "\n" + sources.cite([ENGINE]) + "\n"


# docs/gpu.md's dry-run table: rank 0's engine on one H200 at 48 and 9,408 nodes
# (benchmarks/gpu/dryrun.py): the device memory its caching allocator handed out, beside what the
# engine holds by name and the planner's total for the same job
DRYRUN = f"{sources.RESULTS}/gpu_dryrun_h200.json"
DRYRUN_ORDER = ("frontier", "zeropp", "zero3", "neox20b_4")


def dryrun() -> str:
    doc = sources.load(DRYRUN)
    runs = doc["runs"]
    header = [
        "job (rank 0)",
        "nodes (ranks)",
        "device peak allocated / reserved (GB)",
        "in a step after the first (GB)",
        "engine holds by name (GB)",
        "of it DeepSpeed's gradient bucket",
        "planner's total (GB)",
        "allocated / planner",
    ]
    body = []
    for job in DRYRUN_ORDER:
        for nodes in (48, 9408):
            r = runs[f"{job}_{nodes}"]["report"]
            m, w = r["memory"], r["world"]
            held = m["engine_memory"]
            (planned,) = (t["total"] for t in m["planner_memory"].values())
            alloc = m["device_peak_allocated_bytes"]
            name = "GPT-NeoX-20B recipe, 4 of 44 blocks" if job == "neox20b_4" else f"`{job}`, 3.24M GPT"
            body.append(
                [
                    name,
                    f"{w['nodes']:,} ({w['ranks']:,})",
                    f"{alloc / 1e9:.2f} / {m['device_peak_reserved_bytes'] / 1e9:.2f}",
                    f"{r['per_step']['device_peak_bytes'] / 1e9:.2f}",
                    f"{sum(held.values()) / 1e9:.2f}",
                    f"{held['gradient bucket (DeepSpeed)'] / 1e9:.2f}",
                    f"{planned / 1e9:.2f}",
                    f"{alloc / planned:.2f}",
                ]
            )
    cond = sources.meta(DRYRUN)["conditions"]
    note = f"Device: {cond['device']}. {cond['concurrency']}.\n"
    return fmt.table(header, body) + "\n" + note + sources.cite([DRYRUN]) + "\n"
