"""The data orders' cache at a real sample count, on this machine's CPU: rank 0 builds (or
checks) the shuffle or a blend's order for ``--samples`` samples, another rank opens them and
reads its micro-batches ([Note: data order caches] in zeropp_hier/app/data/order_cache.py).

The token files are sparse (zeros: only the index is real), so 300B tokens' worth of samples
(146,484,374 at 2,048 tokens each) costs no disk: the sample count is what the orders depend on,
here reached with ``--seq-len 16``. Each role runs in its own process (``--role``), which prints
one JSON line: seconds, the process's peak RSS (VmHWM) beside its RSS after imports, and how
much its private (RssAnon) and file-mapped (RssFile: page cache, shared by the node's ranks,
reclaimable) memory grew.

    python -m benchmarks.cpu.data_orders --dir /tmp/orders --samples 146484374 --role build
    python -m benchmarks.cpu.data_orders --dir /tmp/orders --samples 146484374 --role open
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import time

import numpy as np


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def sparse_pair(prefix: str, tokens: int) -> str:
    """A Megatron pair of ``tokens`` zero tokens (uint16), the .bin sparse, sequences of at most
    2**30 tokens (the index's sizes are int32)."""
    from zeropp_hier.app.data import indexed

    step = 1 << 30
    sizes = np.array([min(step, tokens - k) for k in range(0, tokens, step)], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64) * 2]).astype(np.int64)
    with open(prefix + ".bin", "wb") as f:
        f.truncate(tokens * 2)
    doc = np.arange(len(sizes) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(struct.pack("<9sQBQQ", indexed.MAGIC, 1, 8, len(sizes), len(doc)))
        f.write(sizes.tobytes() + pointers.tobytes() + doc.tobytes())
    return prefix


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--samples", type=int, default=146_484_374)  # 300B tokens at 2,048 a sample
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--weights", default="", help="a blend: e.g. 0.5,0.3,0.2 (default: one pair, shuffled)")
    ap.add_argument("--world", type=int, default=75_264)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--role", choices=("build", "open"), required=True)
    a = ap.parse_args()
    import torch  # noqa: F401  (imported before the baseline RSS is read)

    from zeropp_hier.app.data import order_cache, orders
    from zeropp_hier.app.data.tokens import Loader, open_tokens

    base, anon, mapped = _rss("VmRSS"), _rss("RssAnon"), _rss("RssFile")
    os.makedirs(a.dir, exist_ok=True)
    weights = [float(w) for w in a.weights.split(",")] if a.weights else [1.0]
    prefixes = []
    for d, w in enumerate(weights):
        prefix = os.path.join(a.dir, f"pair{d}")
        if a.role == "build":
            sparse_pair(prefix, int(a.samples * w) * a.seq_len + 1)
        prefixes.append(prefix)
    path = prefixes[0] if len(weights) == 1 else " ".join(f"{w} {p}" for w, p in zip(weights, prefixes))
    rank = 0 if a.role == "build" else 5
    loader = Loader(open_tokens(path), a.seq_len, a.micro, rank, a.world, seed=1)
    last = a.steps * a.world * a.micro
    cache = os.path.join(a.dir, "cache")
    t0 = time.perf_counter()
    if a.role == "build":
        orders.start(loader, 0, last, cache, 0)
    else:
        orders.attach(loader, 0, last, order_cache.opener(__import__("pathlib").Path(cache), builder=False))
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    for i in range(a.steps):
        for g in loader.sample_ids(i):
            if len(weights) > 1:  # a blend's loader passes positions through: the blend orders them
                loader.data.source(g, a.seq_len)
    read = time.perf_counter() - t1
    print(
        json.dumps(
            {
                "role": a.role,
                "samples": loader.n,
                "pairs": len(weights),
                "start_seconds": round(seconds, 3),
                "sample_ids_seconds_per_micro_batch": round(read / a.steps, 6),
                "rss_after_imports_mib": round(base / 2**20, 1),
                "peak_rss_mib": round(_rss("VmHWM") / 2**20, 1),
                # private memory, and file pages mapped (the page cache, shared by a node's ranks)
                "anon_growth_mib": round((_rss("RssAnon") - anon) / 2**20, 1),
                "file_mapped_growth_mib": round((_rss("RssFile") - mapped) / 2**20, 1),
                "cache_mib": round(
                    sum(f.stat().st_size for f in __import__("pathlib").Path(cache).glob("*")) / 2**20, 1
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
