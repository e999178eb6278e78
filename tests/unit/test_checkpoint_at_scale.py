"""What one rank does at a checkpoint's save and load, and at start-up, does not grow with the
world: counted at 48 and 9,408 nodes x 4 packages x 2 GCDs (75,264 ranks), by pure code and
through PyTorch's fake process group in a child process (tests/unit/scale_counts.py), never
timed ([Note: checks in shares], [Note: a manifest in pieces], [Note: a coordinator, not a world
gather], [Note: one rank's names at load], [Note: universal rows])."""

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zeropp_hier.app.train import rank_overrides
from zeropp_hier.deepspeed.checkpoint import coordinate_files, own_files
from zeropp_hier.deepspeed.checkpoint.files import share_of
from zeropp_hier.deepspeed.checkpoint.pieces import SUM_FIELDS
from zeropp_hier.deepspeed.checkpoint.universal import kept_slice, old_rank_file

from .scale_counts import OBJECT_COLLECTIVES, ds_names

ROOT = Path(__file__).resolve().parents[2]
FRONTIER_NODES = 9408
WORLD = FRONTIER_NODES * 4 * 2


def _counts(nodes: int, rank: int, tmp_path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.scale_counts", str(nodes), str(rank), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def coordinator_counts(tmp_path_factory):
    """Rank 0's counts at 48 and at 9,408 nodes."""
    return {n: _counts(n, 0, tmp_path_factory.mktemp(f"n{n}")) for n in (48, FRONTIER_NODES)}


def _objects(c: dict) -> int:
    return sum(v for k, v in c.items() if k.split(":")[-1] in OBJECT_COLLECTIVES and k.startswith("call:"))


def test_load_checks_touch_the_same_files_on_the_coordinator_at_48_and_9408_nodes(coordinator_counts):
    small, big = coordinator_counts[48]["load"], coordinator_counts[FRONTIER_NODES]["load"]
    assert coordinator_counts[FRONTIER_NODES]["world"] == WORLD
    # the top manifest, and its own two files (each hashed, and its pickle scanned): no piece
    assert big["open"] == small["open"] == 1 + 2 * 2, big
    # one walk of the tag (it and its pieces directory), for files no manifest lists
    assert big["list"] == small["list"] == 2
    assert big["stat"] == small["stat"] <= 16, big  # of its own files and the tag, not of the world's
    assert _objects(big) == 0  # no object collective: a broadcast and a few all-reduces
    assert "call:scatter" not in big and "call:gather" not in big  # nothing dealt out, nothing gathered
    # what it receives: the small head and the sums, a constant ([Note: a manifest in pieces])
    received = sum(v for k, v in big.items() if k.startswith("bytes:"))
    assert received < 1024 and received - sum(v for k, v in small.items() if k.startswith("bytes:")) < 16


def test_deepspeeds_load_names_and_opens_only_this_ranks_optimizer_file(coordinator_counts):
    for nodes, c in coordinator_counts.items():
        ds = c["ds_load"]
        assert ds["names"] == ds["states"] == nodes * 8 and ds["mine"]  # the saved world's length
        assert ds["open"] == 1 and ds.get("stat", 0) <= 1 and ds.get("list", 0) == 0, ds


def test_save_sums_the_pieces_on_the_coordinator(coordinator_counts):
    for c in coordinator_counts.values():
        save = c["save"]
        assert _objects(save) == 0 and "call:gather" not in save
        assert save["call:all_reduce"] == 2  # the pieces' sums, the largest rank's bytes
        assert save["bytes:all_reduce"] == 8 * (len(SUM_FIELDS) + 2) + 8, save  # whatever the world
        # one walk of the temporary tag (it and its pieces directory); no piece read
        assert save["list"] == 2 and save.get("open", 0) == 0
        assert save["error"] is None and save["rest"] == []


def test_start_up_agreements_are_fixed_size_all_reduces(coordinator_counts):
    for c in coordinator_counts.values():
        start = c["start"]
        assert _objects(start) == 0 and set(k for k in start if k.startswith("call:")) == {"call:all_reduce"}
        # agree_same: one [d, -d] all-reduce however big the summary (here: a 75,264-entry rank map)
        assert start["bytes:all_reduce"] == 16 + 8, start


# -- pure, at 9,408 nodes ----------------------------------------------------------------------


def test_every_rank_checks_at_most_two_files_at_load():
    names = sorted(ds_names(WORLD))
    assert len(names) == 2 * WORLD
    widths = []
    for rank in (0, 1, WORLD // 2, WORLD - 1):
        share = share_of(names, rank, WORLD)
        assert 1 <= len(share) <= math.ceil(len(names) / WORLD) == 2
        entries = {n: {"bytes": 1 << 40, "sha256": "f" * 64} for n in share}
        widths.append(len(json.dumps(entries, separators=(",", ":"))))
    assert max(widths) < 512  # the scatter slot a rank receives: bytes, whatever the world


def test_a_rank_hashes_only_the_files_it_wrote_at_save(tmp_path):
    tmp = str(tmp_path / ".tmp-t")
    rank = WORLD - 1
    written = [os.path.join(tmp, f"zero_pp_rank_{rank}_mp_rank_00_{k}_states.pt") for k in ("model", "optim")]
    written.append(os.path.join(tmp_path, "zero_to_fp32.py"))  # outside the tag: not its to hash
    assert own_files(written + written[:1], tmp) == sorted(os.path.basename(p) for p in written[:2])
    # the coordinator: each rank's entries against its one listing
    parts = [{n: {"bytes": 1, "sha256": "0"}} for n in ds_names(4)]
    files, error, rest = coordinate_files(tmp, parts, ds_names(4) + ["extra.json"])
    assert len(files) == 8 and error is None and rest == ["extra.json"]
    files, error, _ = coordinate_files(tmp, parts, ds_names(4)[1:])
    assert error is not None and error[0] == 0 and "rank 0 does not see it" in error[2]


def test_universal_load_reads_only_the_rows_a_rank_keeps():
    for numel in (1, 6016, 50_304 * 6144, WORLD * 3 + 5):
        counts = []
        for rank in (0, 1, WORLD // 2, WORLD - 1):
            start, count, width = kept_slice(numel, WORLD, rank)
            assert width == math.ceil(numel / WORLD) and 0 <= count <= width
            assert start + count <= numel
            counts.append(count)
        # every element is kept by exactly one rank: the slices tile the tensor
        assert sum(kept_slice(numel, WORLD, r)[1] for r in range(WORLD)) == numel
    # a 20B model's three fp32 states: what one rank reads, against the whole files
    params = 20_000_000_000
    per_rank = 3 * 4 * math.ceil(params / WORLD)
    assert per_rank < 4 << 20 and 3 * 4 * params / per_rank > 70_000


def test_old_ranks_files_are_named_from_old_rank_0s():
    assert old_rank_file("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", 75263) == (
        "bf16_zero_pp_rank_75263_mp_rank_00_optim_states.pt"
    )
    assert old_rank_file("zero_pp_rank_0_mp_rank_00_model_states.pt", 7) == "zero_pp_rank_7_mp_rank_00_model_states.pt"


PATH_MODULES = (
    "deepspeed/checkpoint/atomic.py",
    "deepspeed/checkpoint/shares.py",
    "deepspeed/checkpoint/files.py",
    "deepspeed/checkpoint/universal.py",
    "comm/agree.py",
    "comm/_coordinator.py",
    "detect/probe.py",
    "app/run.py",
    "launch/rendezvous.py",
)


def test_no_world_all_gather_object_on_the_save_load_or_start_up_path():
    for rel in PATH_MODULES:
        tree = ast.parse((ROOT / "zeropp_hier" / rel).read_text())
        calls = [
            n.func.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "all_gather_object"
        ]
        assert calls == [], rel


def test_only_rank_0_writes_hydra_files_and_the_log():
    assert rank_overrides({}, []) == []
    assert rank_overrides({"RANK": "0", "WORLD_SIZE": "8"}, []) == []
    assert rank_overrides({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, []) == []
    for env in ({"RANK": "5"}, {"SLURM_PROCID": "75263", "SLURM_NTASKS": str(WORLD)}):
        assert rank_overrides(env, ["steps=5"]) == ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    assert rank_overrides({"RANK": "5"}, ["-m", "preset=zero3,frontier"]) == []  # a sweep: Hydra launches
    assert rank_overrides({"SLURM_PROCID": "3", "SLURM_NTASKS": "1"}, []) == []  # one task: spawns its ranks
