"""Run DeepSpeed's own ZeRO-3 unit tests against zeropp_hier.

    nice -n 19 python benchmarks/deepspeed_unit/run.py --ds-tests /tmp/ds_src/tests

1. ``stock``: the selected tests of DeepSpeed's ``tests/unit/runtime/zero`` and
   ``tests/unit/v1/zero`` (after the pruning in ``prune``) with stock DeepSpeed, recording which
   tests build a ZeRO stage-3 engine through ``deepspeed.initialize``.
2. One run per configuration (``frontier-none``, ``frontier-default``, ``zeropp-none``,
   ``zeropp-default``: preset and compression) of the tests that passed stock *and* built a
   stage-3 engine, with ``zeropp_hier.patch_deepspeed()`` in every process and a ``zeropp_hier``
   section injected into every stage-3 config (``inject/sitecustomize.py``).

Results go, per test, to ``<work>/<config>.jsonl`` (resumable: a rerun skips tests already
recorded; ``--fresh`` starts over) and, summed up, to ``benchmarks/results/deepspeed_unit.json``;
a markdown table is printed. DeepSpeed's tests are not part of this repository: point
``--ds-tests`` (or ``DS_TESTS_DIR``) at the ``tests`` folder of a DeepSpeed checkout, e.g. the
one ``get_ds_tests.sh`` extracts. The zeropp_hier under test is this checkout's (its root goes
first on PYTHONPATH), not whatever ``pip`` installed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INJECT = os.path.join(HERE, "inject")
RESULT_JSON = os.path.join(REPO, "benchmarks", "results", "deepspeed_unit.json")
DIRS = ("unit/runtime/zero", "unit/v1/zero")
CONFIGS = {  # name: (preset, compression)
    "frontier-none": ("frontier", "none"),
    "frontier-default": ("frontier", "default"),
    "zeropp-none": ("zeropp", "none"),
    "zeropp-default": ("zeropp", "default"),
}
# each injected configuration also with "overlap": "gpu" (the issue mode NCCL/RCCL run, on gloo
# too: ticks for frontier, one lane for zeropp; zeropp_hier/comm/issue.py), named <config>-gpu;
# ``--overlap gpu`` adds them to the run beside the default mode
OVERLAP = {f"{name}-gpu": "gpu" for name in CONFIGS}
CONFIGS.update({f"{name}-gpu": CONFIGS[name] for name in list(CONFIGS)})

# Whole files left out, and why (kept in the result JSON).
PRUNED_FILES = {
    "unit/runtime/zero/test_zero_config.py": "config parsing only: never calls deepspeed.initialize",
    "unit/runtime/zero/test_zero_tiled.py": "TiledLinear under zero.Init only: never calls deepspeed.initialize",
    "unit/runtime/zero/test_zero_allreduce_fetch_params.py": "zero.Init only: never calls deepspeed.initialize",
    "unit/v1/zero/test_zero_init_pg_contradiction.py": "zero.Init groups only: never calls deepspeed.initialize",
    "unit/v1/zero/test_overlap_comm_record_stream.py": "CUDA stream record_stream: never calls deepspeed.initialize",
    "unit/v1/zero/test_stage2_flatten_on_gpu.py": "ZeRO stage 2 only (and accelerator flattening)",
    "unit/v1/zero/test_zero2_offload_multi_backward.py": "ZeRO stage 2 only",
}


def prune(test: dict) -> str | None:
    """Why one collected test is left out (None: kept)."""
    f = test["nodeid"].split("::")[0]
    if f in PRUNED_FILES:
        return PRUNED_FILES[f]
    p = test["params"]
    for k in ("zero_stage", "stage"):
        if k in p and p[k] != "3":
            return f"ZeRO stage {p[k]} (not stage 3)"
    for k in ("dtype", "precision"):
        v = p.get(k, "")
        if v in ("torch.float16", "'fp16'", "torch.half"):
            return "fp16: this CPU has no fp16 support (DeepSpeed's CPU accelerator refuses it)"
    if p.get("fp16_enabled") == "True":
        return "fp16: this CPU has no fp16 support (DeepSpeed's CPU accelerator refuses it)"
    if "nvme" in p.get("offload_device", ""):
        return "NVMe offload: DeepSpeed's async_io op is not built here"
    return None


# zeropp_hier refusals that are by design (README: what zeropp_hier does not support)
BY_DESIGN = {
    "zero_optimization.offload_param": "parameter offload",
    "zero_optimization.offload_param.device": "parameter offload",
    "zero_optimization.zero_hpz_partition_size": "DeepSpeed hpZ key",
    "zero_optimization.zero_quantized_weights": "DeepSpeed qwZ key",
    "zero_optimization.zero_quantized_nontrainable_weights": "DeepSpeed qwZ key",
    "zero_optimization.zero_quantized_gradients": "DeepSpeed qgZ key",
    "zero_optimization.reduce_scatter": "reduce_scatter=false (bypasses the hierarchical reduction)",
    "gradient_predivide_factor": "gradient_predivide_factor != 1",
    "zeropp_hier.numerics.nonfinite": "nonfinite=raise with fp16",
}


def by_design(rec: dict) -> str | None:
    for r in rec.get("marks", {}).get("refused", []):
        if r.get("field") in BY_DESIGN:
            return BY_DESIGN[r["field"]]
        msg = r.get("msg") or ""
        # the engine's check names super_offload; it also fires when DeepSpeed built its
        # optimizer-less DeepSpeedZeRoOffload (initialize without an optimizer), which is no
        # documented refusal and is counted as a failure
        if "super_offload is not supported" in msg and "DeepSpeedZeRoOffload" not in msg:
            return "super_offload"
    return None


def env_for(config: str, work: str, results: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([INJECT, REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["DS_ACCELERATOR"] = "cpu"
    env.setdefault("DS_UNITTEST_TIMEOUT", "600")  # DeepSpeed's per-test launcher timeout (s)
    # the plugin's watchdog: also covers DeepSpeed's pool teardown, which has no timeout
    env.setdefault("ZEROPP_HIER_PEER_TEST_TIMEOUT", str(int(env["DS_UNITTEST_TIMEOUT"]) + 200))
    env.setdefault("OMP_NUM_THREADS", "1")  # several ranks share few cores
    # DeepSpeed's CPU accelerator counts NUMA nodes as devices (1 here) and DistributedTest skips
    # any test with more ranks than devices; LOCAL_SIZE is what it reads first.
    env["LOCAL_SIZE"] = env.get("ZEROPP_DS_UNIT_MAX_WORLD", "4")
    env["ZEROPP_HIER_PEER_MARKS"] = os.path.join(work, f"marks-{config}")
    env["ZEROPP_HIER_PEER_RESULTS"] = results
    env.pop("ZEROPP_HIER_PEER_PRESET", None)
    env.pop("ZEROPP_HIER_PEER_COMPRESSION", None)
    env.pop("ZEROPP_HIER_PEER_COLLECT", None)
    env.pop("ZEROPP_HIER_PEER_OVERLAP", None)
    if config != "stock":
        preset, compression = CONFIGS[config]
        env["ZEROPP_HIER_PEER_PRESET"] = preset
        env["ZEROPP_HIER_PEER_COMPRESSION"] = compression
        if config in OVERLAP:
            env["ZEROPP_HIER_PEER_OVERLAP"] = OVERLAP[config]
    return env


def pytest_cmd(ds_tests: str, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "zeropp_peer_plugin",
        "-o",
        "console_output_style=classic",
        *extra,
    ]


def collect(ds_tests: str, work: str) -> list[dict]:
    out = os.path.join(work, "collected.jsonl")
    if not os.path.exists(out):
        env = env_for("stock", work, os.devnull)
        env["ZEROPP_HIER_PEER_COLLECT"] = out
        subprocess.run(
            pytest_cmd(ds_tests, ["--collect-only", *DIRS]),
            cwd=ds_tests,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    with open(out) as f:
        return [json.loads(line) for line in f]


def load(path: str) -> dict[str, dict]:
    recs = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    recs[r["nodeid"]] = r
    return recs


def run_file(config: str, f: str, file_ids: list[str], ds_tests: str, work: str, file_timeout: int) -> None:
    """Run one test file's ``file_ids`` under ``config`` until each has a record."""
    results = os.path.join(work, f"{config}.jsonl")
    env = env_for(config, work, results)
    while True:
        done = load(results)
        todo = [i for i in file_ids if i not in done]
        if not todo:
            return
        n0 = len(done)
        t0 = time.time()
        stem = f"{config}-{os.path.basename(f)}-{int(t0)}"
        junit = os.path.join(work, "junit", stem + ".xml")
        log = os.path.join(work, "logs", stem + ".log")
        os.makedirs(os.path.dirname(junit), exist_ok=True)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        print(f"[{time.strftime('%H:%M:%S')}] [{config}] {f}: {len(todo)} tests", flush=True)
        with open(log, "w") as lf:
            # its own session, so that ranks left behind by a killed pytest can be ended with it
            proc = subprocess.Popen(
                pytest_cmd(ds_tests, [f"--junitxml={junit}", *todo]),
                cwd=ds_tests,
                env=env,
                stdout=lf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=file_timeout)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        done = load(results)
        print(
            f"[{time.strftime('%H:%M:%S')}] [{config}] {f}: {len(done) - n0} recorded in {time.time() - t0:.0f}s",
            flush=True,
        )
        if len(done) == n0:  # nothing ran (collection error, crash): record and move on
            with open(log) as lf:
                tail = lf.read()[-3000:]
            with open(results, "a") as rf:
                for i in todo:
                    rf.write(
                        json.dumps({"nodeid": i, "outcome": "not-run", "duration": 0, "text": tail, "marks": {}})
                        + "\n"
                    )
            return


def ids_for(config: str, selected: list[str], work: str) -> list[str]:
    if config == "stock":
        return selected
    stock = load(os.path.join(work, "stock.jsonl"))
    return [
        n
        for n in selected
        if n in stock and stock[n]["outcome"] == "passed" and stock[n].get("marks", {}).get("stage3")
    ]


_CLOSENESS = ("not close", "allclose", "assert_close", "Greatest absolute difference", "assert_equal", "max-abs-diff")


def signature(rec: dict) -> str:
    """One line saying why a test did not pass: the zeropp_hier refusal, else pytest's last E line."""
    for r in rec.get("marks", {}).get("refused", []):
        return r.get("msg") or ""
    lines = [ln[1:].strip() for ln in rec.get("text", "").splitlines() if ln.startswith("E ") and ln[1:].strip()]
    if lines:
        return lines[0][:300]
    rest = [ln.strip() for ln in rec.get("text", "").splitlines() if ln.strip()]
    return rest[-1][:300] if rest else rec["outcome"]


def classify(config: str, rec: dict, uncompressed: dict | None = None) -> str:
    """stock: the pytest outcome. Injected: refused-by-design, tolerance-under-compression (a
    closeness assertion failing with compression on, where the same preset without compression
    passed), passed-not-hier (injected but a stock engine was built), or the pytest outcome."""
    o = rec["outcome"]
    if config == "stock":
        return o
    if o in ("failed", "error", "hang") and by_design(rec):
        return "refused-by-design"
    if (
        o == "failed"
        and CONFIGS[config][1] != "none"
        and uncompressed is not None
        and uncompressed.get(rec["nodeid"], {}).get("outcome") == "passed"
        and any(k in rec.get("text", "") for k in _CLOSENESS)
    ):
        return "tolerance-under-compression"
    m = rec.get("marks", {})
    if o == "passed" and m.get("injected") and not any(e.get("hier") for e in m.get("engines", [])):
        return "passed-not-hier"  # injected, but the engine built was stock DeepSpeed's
    return o


def summarise(selected, pruned, results: dict[str, dict[str, dict]], meta: dict) -> dict:
    out = {"meta": meta, "pruned": pruned, "selected": len(selected), "configs": {}}
    for config, recs in results.items():
        uncompressed = None
        if config != "stock" and CONFIGS[config][1] != "none":
            uncompressed = results.get(f"{CONFIGS[config][0]}-none" + ("-gpu" if config in OVERLAP else ""))
        groups = collections.defaultdict(list)
        for nodeid, rec in sorted(recs.items()):
            groups[classify(config, rec, uncompressed)].append(nodeid)
        entry = {
            "tests": len(recs),
            "counts": {k: len(v) for k, v in sorted(groups.items())},
            "ids": {k: v for k, v in sorted(groups.items())},
        }
        if config == "stock":
            entry["stage3_passed"] = sorted(
                n for n, r in recs.items() if r["outcome"] == "passed" and r.get("marks", {}).get("stage3")
            )
            entry["not_passed"] = {
                n: signature(recs[n])
                for k in ("failed", "error", "hang", "not-run", "skipped")
                for n in groups.get(k, [])
            }
        else:
            entry["refusals"] = {n: by_design(recs[n]) for n in groups.get("refused-by-design", [])}
            entry["tolerance"] = {n: signature(recs[n]) for n in groups.get("tolerance-under-compression", [])}
            entry["failures"] = {
                n: signature(recs[n]) for k in ("failed", "error", "hang", "not-run") for n in groups.get(k, [])
            }
            entry["failure_texts"] = {
                n: recs[n]["text"][-1500:] for k in ("failed", "error", "hang", "not-run") for n in groups.get(k, [])
            }
        out["configs"][config] = entry
    return out


def table(summary: dict) -> str:
    cols = [
        "passed",
        "failed",
        "error",
        "hang",
        "skipped",
        "refused-by-design",
        "tolerance-under-compression",
        "passed-not-hier",
        "not-run",
    ]
    lines = ["| configuration | ran / planned | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for config, e in summary["configs"].items():
        c = e["counts"]
        done = f"{e['tests']} / {e.get('planned', '?')}" + ("" if e.get("complete") else " (partial)")
        lines.append(f"| {config} | {done} | " + " | ".join(str(c.get(k, 0)) for k in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--ds-tests",
        default=os.environ.get("DS_TESTS_DIR", "/tmp/ds_src/tests"),
        help="the tests/ folder of a DeepSpeed checkout (see get_ds_tests.sh)",
    )
    ap.add_argument(
        "--work",
        default=os.environ.get("ZEROPP_DS_UNIT_WORK", "/tmp/zeropp_ds_unit"),
        help="per-test records, logs, junit XML (resumable)",
    )
    ap.add_argument(
        "--configs",
        default="stock,frontier-none,frontier-default;zeropp-none,zeropp-default",
        help="configurations: ',' inside a group, ';' between groups; 'stock' must come "
        "first (the others run the tests that passed stock and built a stage-3 engine)",
    )
    ap.add_argument("--fresh", action="store_true", help="forget earlier records in --work")
    ap.add_argument("--file-timeout", type=int, default=3 * 3600, help="seconds for one pytest process")
    ap.add_argument("--report-only", action="store_true", help="summarise the records in --work, run nothing")
    ap.add_argument("--select", default="", help="comma-separated substrings: run only node ids holding one")
    ap.add_argument(
        "--first",
        default="",
        help="comma-separated substrings: files holding one run first, "
        "in this order (then the rest, small files first)",
    )
    ap.add_argument(
        "--max-per-file",
        type=int,
        default=0,
        help="at most this many tests of a file, spread over its parameters (0: all)",
    )
    ap.add_argument(
        "--overlap",
        choices=["gpu"],
        default=None,
        help='also run every injected configuration with "overlap": "gpu" injected (<config>-gpu), after it',
    )
    ap.add_argument("--out", default=RESULT_JSON)
    args = ap.parse_args()
    try:
        os.nice(19)  # only idle CPU: this machine is shared
    except OSError:
        pass
    ds_tests = os.path.abspath(args.ds_tests)
    if not os.path.isdir(os.path.join(ds_tests, "unit", "runtime", "zero")):
        sys.exit(f"{ds_tests} is not DeepSpeed's tests/ folder: run benchmarks/deepspeed_unit/get_ds_tests.sh")
    os.makedirs(args.work, exist_ok=True)
    if args.fresh:
        for name in os.listdir(args.work):
            if name.endswith(".jsonl"):
                os.remove(os.path.join(args.work, name))
    tests = collect(ds_tests, args.work)
    selected, pruned = [], {}
    for t in tests:
        why = prune(t)
        if not why and args.select and not any(s in t["nodeid"] for s in args.select.split(",")):
            continue
        if why:
            pruned[t["nodeid"]] = why
        else:
            selected.append(t["nodeid"])
    # Groups (';') run one after the other; inside a group, file by file, every config of the
    # group runs on a file before the next file (stock first), so results come early for all.
    groups = [[c for c in g.split(",") if c] for g in args.configs.split(";")]
    if args.overlap:  # each injected configuration followed by its "-gpu" twin, file by file
        groups = [[x for c in g for x in ([c] if c == "stock" or c in OVERLAP else [c, f"{c}-gpu"])] for g in groups]
    configs = [c for g in groups for c in g]
    for c in configs:
        if c != "stock" and c not in CONFIGS:
            sys.exit(f"unknown configuration {c!r}: use stock or one of {list(CONFIGS)}")
    by_file = collections.defaultdict(list)
    for n in selected:
        by_file[n.split("::")[0]].append(n)
    if args.max_per_file > 0:  # every k-th test of a big file, so its parameters stay spread
        for f, ids in by_file.items():
            if len(ids) > args.max_per_file:
                step = len(ids) / args.max_per_file
                keep = [ids[int(i * step)] for i in range(args.max_per_file)]
                for n in ids:
                    if n not in keep:
                        pruned[n] = f"--max-per-file {args.max_per_file} (time budget)"
                by_file[f] = keep
        selected = [n for f in by_file for n in by_file[f]]
    first = [x for x in args.first.split(",") if x]
    files = sorted(
        by_file, key=lambda f: (next((i for i, x in enumerate(first) if x in f), len(first)), len(by_file[f]), f)
    )  # --first, then small files first
    if not args.report_only:
        for group in groups:
            for f in files:
                for config in group:
                    ids = [n for n in ids_for(config, by_file[f], args.work)]
                    if ids:
                        run_file(config, f, ids, ds_tests, args.work, args.file_timeout)
    results, planned = {}, {}
    for config in configs:
        ids = set(ids_for(config, selected, args.work))
        recs = load(os.path.join(args.work, f"{config}.jsonl"))
        results[config] = {n: r for n, r in recs.items() if n in ids}
        planned[config] = len(ids)
    import deepspeed
    import torch

    meta = {
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "ds_tests": ds_tests,
        "ds_tests_source": open(os.path.join(ds_tests, "..", "SOURCE")).read().strip()
        if os.path.exists(os.path.join(ds_tests, "..", "SOURCE"))
        else None,
        "zeropp_hier_commit": subprocess.run(
            ["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "dirs": list(DIRS),
        "collected": len(tests),
        "pruned_by_reason": dict(collections.Counter(pruned.values())),
        "topology": "world 1 -> 1x1, 2 -> 1x1 (2 nodes), 4 -> 2x1 (2 nodes), 8 -> 2x2 (2 nodes)",
        "injected_configs": {
            c: {"preset": p, "compression": z, **({"overlap": OVERLAP[c]} if c in OVERLAP else {})}
            for c, (p, z) in CONFIGS.items()
        },
    }
    summary = summarise(selected, pruned, results, meta)
    for config, e in summary["configs"].items():
        e["planned"] = planned[config]
        e["complete"] = e["tests"] == planned[config] and (
            config == "stock" or summary["configs"].get("stock", {}).get("complete", False)
        )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    from zeropp_hier.files import write_json_atomic

    write_json_atomic(args.out, summary, indent=1, sort_keys=False)
    print(table(summary))


if __name__ == "__main__":
    main()
