"""``init_from``'s pure parts (app/model/pretrained.py): which flat range and which rows of each weight
a rank reads (DeepSpeed's primary partitioning), bounded at 9,408 Frontier nodes; the job's model
against a directory's config.json as transformers writes it; the refusals, each naming the field."""

import json
import os
from dataclasses import replace

import pytest

from zeropp_hier.app.job_vocab import with_data_vocab
from zeropp_hier.app.model import pretrained
from zeropp_hier.app.model.models import neox_config
from zeropp_hier.app.spec import MODELS, JobSpec, ModelSpec
from zeropp_hier.core.errors import HierConfigError

FRONTIER_RANKS = 9408 * 8  # 9,408 nodes x 4 MI250X x 2 GCDs


def _partition_numel(numel: int, world: int) -> int:
    return -(-numel // world)  # DeepSpeed pads the flat weight to a multiple of the world


def _neox_shapes(spec: ModelSpec) -> list[tuple[int, ...]]:
    h, i, v = spec.hidden, spec.intermediate, spec.vocab
    return [(v, h), (3 * h, h), (3 * h,), (h, h), (h,), (i, h), (i,), (h, i)]


@pytest.mark.parametrize("world", [1, 3, 8, 7])
@pytest.mark.parametrize("shape", [(5, 7), (12,), (3, 4, 5), (1, 9)])
def test_the_ranks_ranges_cover_the_weight_once_in_order(world, shape):
    numel = 1
    for d in shape:
        numel *= d
    n = _partition_numel(numel, world)
    flat = list(range(numel))
    got = []
    for rank in range(world):
        start, stop = pretrained.shard_range(numel, n, rank)
        first, end, offset = pretrained.row_span(shape, start, stop)
        row = numel // shape[0]
        rows = flat[first * row : end * row]
        got += rows[offset : offset + stop - start]
    assert got == flat


def test_what_a_rank_reads_at_9408_nodes_is_bounded():
    """GPT-NeoX-20B on every rank of 9,408 nodes: a rank reads its partition of each weight and
    at most two rows beyond it, never the weight."""
    spec = MODELS["neox_20b"]
    worst = 0.0
    for shape in _neox_shapes(spec):
        numel = 1
        for d in shape:
            numel *= d
        row = numel // shape[0]
        n = _partition_numel(numel, FRONTIER_RANKS)
        for rank in range(FRONTIER_RANKS):
            start, stop = pretrained.shard_range(numel, n, rank)
            first, end, _ = pretrained.row_span(shape, start, stop)
            read = (end - first) * row
            assert read <= n + 2 * row
            worst = max(worst, read / numel)
    # the largest share of one weight any rank reads: two elements of a 6,144-element bias
    assert worst <= 2 / spec.hidden, worst


def _write_config(path, spec: ModelSpec, **changes) -> str:
    cfg = neox_config(spec)
    for k, v in changes.items():
        setattr(cfg, k, v)
    os.makedirs(path, exist_ok=True)
    cfg.save_pretrained(str(path))  # transformers' own config.json
    return str(path)


def test_a_directory_of_the_jobs_shape_agrees_and_gives_its_vocabulary(tmp_path):
    small = MODELS["small"]
    path = _write_config(tmp_path / "m", small)
    assert pretrained.model_spec(small, path) == small
    # a job that leaves the vocabulary to the data takes the directory's
    got = with_data_vocab(JobSpec(model=replace(small, vocab_size=None), init_from=path)).model
    assert got.vocab_size == small.vocab_size
    # a shorter training length than the directory's positions is fine
    assert pretrained.model_spec(replace(small, seq_len=512), path).seq_len == 512


def test_another_shape_is_refused_naming_the_field_and_the_size_that_agrees(tmp_path):
    path = _write_config(tmp_path / "m", MODELS["small"])
    with pytest.raises(HierConfigError, match=r"model.hidden.*hidden_size = 768.*use model=small") as e:
        pretrained.model_spec(MODELS["tiny"], path)
    assert e.value.field == "model.hidden" and e.value.value == 64
    odd = ModelSpec(vocab_size=256, hidden=32, heads=4, layers=2, intermediate=128)
    path = _write_config(tmp_path / "odd", odd)
    with pytest.raises(HierConfigError, match=r"set model.hidden=32"):
        pretrained.model_spec(ModelSpec(vocab_size=256), path)
    with pytest.raises(HierConfigError, match=r"model.seq_len.*max_position_embeddings = 64"):
        pretrained.model_spec(replace(odd, seq_len=128), path)


@pytest.mark.parametrize(
    "field, value",
    [("tie_word_embeddings", True), ("hidden_act", "relu"), ("layer_norm_eps", 1e-6), ("attention_bias", False)],
)
def test_what_the_job_cannot_build_is_refused_naming_the_config_field(tmp_path, field, value):
    path = _write_config(tmp_path / "m", MODELS["tiny"], **{field: value})
    with pytest.raises(HierConfigError, match=rf"init_from \(config.json {field}\)"):
        pretrained.model_spec(MODELS["tiny"], path)


def test_another_rotary_base_is_refused(tmp_path):
    tiny = replace(MODELS["tiny"], vocab_size=256)
    path = _write_config(tmp_path / "m", tiny)
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    cfg["rope_parameters"]["rope_theta"] = 500000.0  # transformers 5's spelling, as it writes it
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(HierConfigError, match="rope_theta"):
        pretrained.model_spec(tiny, path)


def test_a_directory_without_a_model_is_refused_naming_init_from(tmp_path):
    with pytest.raises(HierConfigError, match="init_from.*no such directory"):
        pretrained.read_config(str(tmp_path / "none"))
    with pytest.raises(HierConfigError, match="init_from.*no config.json"):
        pretrained.read_config(str(tmp_path))
    path = _write_config(tmp_path / "m", MODELS["tiny"])
    with pytest.raises(HierConfigError, match="init_from.*no weights in it"):
        pretrained.weight_files(path)
    (tmp_path / "m" / "config.json").write_text("{not json")  # hand-written: a refusal case
    with pytest.raises(HierConfigError, match="cannot be read as JSON"):
        pretrained.read_config(path)


def test_the_hydra_override_reaches_the_job(tmp_path):
    from zeropp_hier.app.train import spec_from_overrides

    assert spec_from_overrides([]).init_from is None
    assert spec_from_overrides([f"init_from={tmp_path}"]).init_from == str(tmp_path)
