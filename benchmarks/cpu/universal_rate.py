"""How long the job's universal conversion takes ([Note: a conversion in shares] in
zeropp_hier/deepspeed/checkpoint/universal.py), on this machine: a GPT-NeoX of about 100M parameters
trained one step on 4 CPU ranks and saved, then converted by 2 ranks each doing its share (what a
resume on half the ranks does) and by one process (``checkpoint.to_universal``, what
``zeropp-hier checkpoint to-universal`` does). Prints the job's conversion line and one line for
the single process, with bytes and seconds; ``--out`` also writes them as JSON with the run's
record (benchmarks/tables/provenance.py), e.g. ``benchmarks/results/universal_rate.json``.

    python -m benchmarks.cpu.universal_rate [--hidden 1024] [--layers 8] [--dir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from benchmarks.tables.provenance import run_meta
from zeropp_hier.app import run as app_run
from zeropp_hier.app.longrun import io_cost
from zeropp_hier.app.spec import ModelSpec, ds_config, n_params
from zeropp_hier.deepspeed import checkpoint
from zeropp_hier.deepspeed.checkpoint import universal as universal_shared
from zeropp_hier.files import write_json_atomic
from zeropp_hier.launch.world import LocalWorld

TAG = "t"


def _save(model: ModelSpec, root: str) -> None:
    engine = app_run.build_engine(ds_config("frontier", micro_batch=1, gpus_per_node=2, gcds_per_gpu=2), model)
    app_run.train_steps(engine, 1)
    engine.save_checkpoint(root, tag=TAG)
    app_run.release(engine)


def _convert(src: str, out: str) -> universal_shared.Conversion:
    return universal_shared.convert(src, out, TAG)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary directory)")
    p.add_argument("--out", default=None, help="also write the figures as JSON here")
    a = p.parse_args()
    model = ModelSpec(vocab_size=256, seq_len=64, hidden=a.hidden, heads=8, layers=a.layers, intermediate=4 * a.hidden)
    work = a.dir or tempfile.mkdtemp(prefix="universal_rate-")
    src = os.path.join(work, "src")
    print(f"model: {n_params(model) / 1e6:.1f}M parameters; files under {work}")
    with LocalWorld(4, timeout=3600, preload=True) as w:
        w.run(_save, model, src)
    with LocalWorld(2, timeout=3600, preload=True) as w:
        c = w.run(_convert, src, os.path.join(work, "shared"))[0]
    print(io_cost.conversion_line(TAG, c.source_world, c.world, c.bytes_read, c.bytes_written, c.seconds))
    t0 = time.perf_counter()
    checkpoint.to_universal(src, os.path.join(work, "one"), TAG)
    seconds = time.perf_counter() - t0
    print(
        f"one process (checkpoint.to_universal): {seconds:.2f} s for the same {c.bytes_read / 1e9:.3g} GB read, "
        f"{c.bytes_written / 1e9:.3g} GB written ({io_cost.rate_gbps(c.bytes_read + c.bytes_written, seconds):.3g} "
        "GB/s read and written)"
    )
    if a.out:
        conditions = {
            "params": n_params(model),
            "hidden": a.hidden,
            "layers": a.layers,
            "saved_by_ranks": c.source_world,
            "converted_by_ranks": c.world,
        }
        rows = {
            "shares": {"seconds": c.seconds, "bytes_read": c.bytes_read, "bytes_written": c.bytes_written},
            "one_process": {"seconds": seconds, "bytes_read": c.bytes_read, "bytes_written": c.bytes_written},
        }
        write_json_atomic(a.out, {"meta": run_meta(conditions), **rows}, indent=1)
    if a.dir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
