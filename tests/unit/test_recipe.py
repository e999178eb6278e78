"""The recipes (configs/recipe/, app/recipe.py): demo is the defaults; the 20B command of
docs/frontier.md builds GPT-NeoX-20B's published settings into the DeepSpeed config and passes the
memory check at 48 nodes; DeepSpeed's own scheduler follows the warm-up and decay asked for; one
warning for a GPU run with the demo's settings. No ranks start."""

import re
import shlex
from pathlib import Path

import pytest
import torch

from zeropp_hier.app import memory_check
from zeropp_hier.app.recipe import toy_settings_warning, write_ds_config
from zeropp_hier.app.spec import MODELS, JobSpec, block_params, layer_buckets, n_params
from zeropp_hier.app.train import spec_from_overrides

FRONTIER_MD = Path(__file__).resolve().parents[2] / "docs" / "frontier.md"


def _spec(overrides) -> JobSpec:
    return spec_from_overrides(overrides)


# OLCF Frontier User Guide, "Job Priority by Node Count" (docs/frontier.md#chained-jobs): the
# longest job of each node-count bin, in hours
FRONTIER_CAP_HOURS = ((91, 2), (183, 6), (9408, 12))
GPT_NEOX_20B_TOKENS = 150000 * 1536 * 2048  # 20B.yml's train_iters x the paper's batch x 2048 tokens


def _sbatch_lines() -> list[str]:
    """Every `sbatch ... train.sbatch ... recipe=neox20b ...` command of docs/frontier.md, one line each."""
    text = FRONTIER_MD.read_text().replace("\\\n", " ")
    pattern = r"sbatch .*scripts/frontier/train\.sbatch .*recipe=neox20b"
    return [ln for ln in text.splitlines() if re.match(pattern, ln)]


def _sbatch_options(line: str) -> dict[str, str]:
    words = shlex.split(line.replace("<", "").replace(">", ""))
    opts = words[1 : words.index("scripts/frontier/train.sbatch")]
    return dict(zip(opts[::2], opts[1::2]))


def _docs_20b_commands() -> list[list[str]]:
    """The Hydra overrides of each 20B `sbatch ... train.sbatch` command of docs/frontier.md."""
    out = []
    for ln in _sbatch_lines():
        words = shlex.split(ln.replace("<", "").replace(">", ""))
        out.append(words[words.index("scripts/frontier/train.sbatch") + 1 :])
    return out


def _hours(limit: str) -> float:
    h, m, sec = (int(x) for x in limit.split(":"))
    return h + m / 60 + sec / 3600


def test_demo_recipe_is_the_defaults():
    assert _spec(["recipe=demo"]) == _spec([]) == JobSpec()
    cfg = JobSpec().ds_config()
    assert "scheduler" not in cfg and "gradient_clipping" not in cfg
    assert cfg["zero_optimization"]["stage3_prefetch_bucket_size"] == 0  # the demo's regather


def test_the_docs_20b_command_builds_the_published_settings():
    cmds = _docs_20b_commands()
    assert len(cmds) == 2 and all("recipe=neox20b" in c for c in cmds), cmds
    for overrides in cmds:
        spec = _spec(overrides)
        assert spec.model == MODELS["neox_20b"] and spec.model.seq_len == 2048
        ds = spec.ds_config(world=384)
        # EleutherAI gpt-neox configs/20B.yml
        opt = ds["optimizer"]["params"]
        assert opt["lr"] == 0.97e-4 and opt["betas"] == [0.9, 0.95] and opt["eps"] == 1e-8
        assert opt["weight_decay"] == 0.01 and ds["gradient_clipping"] == 1.0
        # the paper's 1536 sequences per step: micro-batch 2 x 2 accumulated x 384 ranks
        assert ds["gradient_accumulation_steps"] == 2 and ds["train_micro_batch_size_per_gpu"] == 2
        assert (spec.init_method, spec.output_layer_init_method) == ("small_init", "wang_init")
        sched = ds["scheduler"]
        assert sched["type"] == "WarmupCosineLR"
        assert sched["params"]["total_num_steps"] == spec.steps == 150000
        assert sched["params"]["warmup_num_steps"] == 1500  # 1% of the steps
        assert sched["params"]["cos_min_ratio"] == 0.1 and sched["params"]["warmup_min_ratio"] == 0.0
        assert ds["bf16"] == {"enabled": True} and spec.activation_checkpointing == "torch"
        zero = ds["zero_optimization"]
        assert zero["stage"] == 3 and "stage3_max_reuse_distance" not in zero  # prefetch on
        assert zero["stage3_prefetch_bucket_size"] == zero["reduce_bucket_size"] == block_params(spec.model)
        # the memory check passes at 48 Frontier nodes with the recipe's buckets
        table = memory_check.check(spec, 384, 8, "AMD Instinct MI250X")
        assert any(row.rstrip().endswith("| yes |") for row in table if row.startswith(f"| {spec.preset} |")), table
        assert toy_settings_warning(spec) is None


def test_the_docs_20b_commands_are_whole_runs_at_48_32_and_24_nodes():
    """Each documented 20B command trains 1536 sequences per step on the nodes it asks for and on
    32 or 24 (a chain link that comes back on fewer), asks for a time limit within Frontier's cap,
    names a checkpoint directory, saves every N steps, and chains (checkpoint_dir= and steps=,
    what the batch script chains on) up to GPT-NeoX-20B's token count."""
    lines = _sbatch_lines()
    assert len(lines) == 2, lines
    dirs = set()
    for line, overrides in zip(lines, _docs_20b_commands()):
        opts = _sbatch_options(line)
        nodes = int(opts["-N"])
        assert nodes == 48
        cap = next(h for top, h in FRONTIER_CAP_HOURS if nodes <= top)
        assert 0 < _hours(opts["-t"]) <= cap, (opts["-t"], cap)
        spec = _spec(overrides)
        for n in (48, 32, 24):
            world = n * 8
            accum = spec.accum(world)
            ds = spec.ds_config(world=world)
            assert ds["gradient_accumulation_steps"] == accum
            assert world * ds["train_micro_batch_size_per_gpu"] * accum == 1536, n
        assert spec.checkpoint_dir and spec.save_every > 0 and spec.save_every < spec.steps
        assert any(o.startswith("checkpoint_dir=") for o in overrides) and any(
            o.startswith("steps=") for o in overrides
        )
        assert spec.steps * 1536 * spec.model.seq_len == GPT_NEOX_20B_TOKENS
        dirs.add(spec.checkpoint_dir)
    assert len(dirs) == 2  # the two runs chain in their own directories


def test_a_world_that_cannot_split_the_global_batch_is_refused_with_the_numbers():
    spec = _spec(["recipe=neox20b", "model=neox_20b"])  # micro-batch 4: 32 nodes cannot split 1536
    assert spec.accum(384) == 1 and spec.accum(192) == 2
    with pytest.raises(
        ValueError, match=r"'global_batch': got 1536; not a multiple of 256 ranks x micro_batch 4 = 1024"
    ):
        spec.ds_config(world=256)


def test_recipe_1_4b_builds_the_published_1_3b_settings():
    spec = _spec(["recipe=neox1_4b", "model=neox_1_4b", "steps=1000"])
    ds = spec.ds_config(world=16)
    # Pythia-1.4B's 1024 sequences per step (pythia-1.4b.yml: 16 x 64 GPUs): 4 x 16 accumulated x 16
    assert spec.global_batch == 1024 and ds["gradient_accumulation_steps"] == 16
    opt = ds["optimizer"]["params"]  # EleutherAI gpt-neox configs/1-3B.yml
    assert opt["lr"] == 2e-4 and opt["betas"] == [0.9, 0.95] and opt["eps"] == 1e-8 and opt["weight_decay"] == 0.1
    assert ds["gradient_clipping"] == 1.0 and ds["scheduler"]["params"]["warmup_num_steps"] == 10
    assert ds["scheduler"]["params"]["cos_min_ratio"] == 0.1 and ds["bf16"]["enabled"]
    assert ds["zero_optimization"]["stage3_prefetch_bucket_size"] == block_params(MODELS["neox_1_4b"])


def test_a_command_line_value_wins_over_the_recipe():
    spec = _spec(["recipe=neox20b", "lr=1.5e-4", "global_batch=null", "grad_accum=8", "buckets=deepspeed"])
    ds = spec.ds_config()
    assert ds["optimizer"]["params"]["lr"] == 1.5e-4 and ds["gradient_accumulation_steps"] == 8
    assert "stage3_prefetch_bucket_size" not in ds["zero_optimization"]  # DeepSpeed's own bucket sizes


def test_layer_buckets_are_one_block():
    m = MODELS["neox_20b"]
    assert layer_buckets(m) == {"stage3_prefetch_bucket_size": 453064704, "reduce_bucket_size": 453064704}
    # the block is the unit of n_params: layers x block + embeddings, head and final norm
    assert n_params(m) == m.layers * block_params(m) + 2 * m.vocab * m.hidden + 2 * m.hidden


def test_deepspeed_scheduler_follows_the_recipe():
    """DeepSpeed's own WarmupCosineLR, built from the recipe's parameters: lr rises to the peak over
    the warm-up and ends at min_lr_ratio of it."""
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    spec = _spec(["recipe=neox20b", "steps=400"])
    params = spec.ds_config()["scheduler"]["params"]
    assert params["warmup_num_steps"] == 4
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=spec.lr)
    sched = WarmupCosineLR(opt, **params)
    lrs = []
    for _ in range(400):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] < 0.5 * spec.lr and max(lrs) == pytest.approx(spec.lr, rel=1e-3)
    assert lrs.index(max(lrs)) <= 5 and lrs[-1] == pytest.approx(0.1 * spec.lr, rel=0.02)
    print(f"lr: first {lrs[0]:.3g}, peak {max(lrs):.3g} at step {lrs.index(max(lrs))}, last {lrs[-1]:.3g}")


def test_one_warning_for_the_demo_settings_on_a_big_model():
    w = toy_settings_warning(JobSpec(model=MODELS["neox_20b"]))
    assert w is not None and "\n" not in w and w.startswith("WARNING:")
    assert "lr=0.003" in w and "regather=true" in w and "dtype=fp32" in w and "recipe=neox20b" in w
    w = toy_settings_warning(JobSpec(model=MODELS["neox_1_4b"], dtype="bf16", regather=False))
    assert w is not None and "lr=0.003" in w and "fp32" not in w and "recipe=neox1_4b" in w
    assert toy_settings_warning(JobSpec()) is None  # the quickstart's tiny model
    assert toy_settings_warning(JobSpec(model=MODELS["small"])) is None  # 160M: below 1B


def test_warning_is_printed_only_on_gpus(monkeypatch, capsys):
    """launch.memory_lines prints the warning above the memory table when the job sees GPUs."""
    from zeropp_hier.app import launch

    spec = JobSpec(model=MODELS["neox_1_4b"], local_world=8, memory_gb=1000.0)
    launch.memory_lines(spec, None, 0)
    assert "WARNING" not in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "AMD Instinct MI250X")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: type("P", (), {"total_memory": 64e9})())
    launch.memory_lines(spec, None, 1)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("WARNING:") and "recipe=neox1_4b" in out[0]
    assert sum(ln.startswith("WARNING") for ln in out) == 1 and out[1].startswith("memory per rank")


def test_ds_config_is_written_beside_the_metrics(tmp_path):
    cfg = JobSpec().ds_config()
    path = write_ds_config(str(tmp_path), cfg)
    assert path == str(tmp_path / "ds_config.json")
    import json

    assert json.loads(Path(path).read_text()) == cfg
    assert write_ds_config(None, cfg) is None
