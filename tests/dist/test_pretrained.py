"""``init_from``: a Hugging Face GPT-NeoX directory as the job's initial weights, each rank
reading its own partitions (4 ranks, the frontier preset, real engines). The job's first loss
is transformers' own loss of the directory's model on the same tokens (rel 1e-5), for a
``save_pretrained`` directory in one safetensors file, in shards with an index, and as a
``pytorch_model.bin`` read tensors-only; a checkpoint exported by ``export-hf`` continues with
the loss the trained engine had on that batch."""

import os

import pytest
import torch

from zeropp_hier.app.data.tokens import synthetic_batch
from zeropp_hier.app.model.models import ModelSpec, neox_config
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.tools import export_hf

from .ranks_pretrained import FirstBatchLoss

WORLD, MICRO, MODEL = 4, 2, ModelSpec(vocab_size=256, seq_len=32)


def _hf_model(seed: int):
    """A GPT-NeoX of the job's tiny shape with transformers' own random weights."""
    from transformers import GPTNeoXForCausalLM

    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(neox_config(MODEL)).eval()


def hf_first_loss(model) -> float:
    """transformers' loss of ``model`` on every rank's first synthetic batch, averaged as the
    job averages its step loss over the ranks."""
    total = 0.0
    for rank in range(WORLD):
        x, y = synthetic_batch(MODEL, MICRO, 0, rank)
        with torch.no_grad():
            logits = model(input_ids=x).logits
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1)))
    return total / WORLD


def _job(tmp, name, steps=2, **kw) -> JobSpec:
    return JobSpec(steps=steps, micro_batch=MICRO, model=MODEL, progress="off", out_dir=str(tmp / name), **kw)


@pytest.mark.parametrize("layout", ["safetensors", "shards", "bin"])
def test_the_first_loss_is_the_hf_models_loss(world4, tmp_path, layout):
    model = _hf_model(seed=11)
    path = str(tmp_path / "hf")
    if layout == "bin":  # transformers 5 writes safetensors only: the older format by hand
        os.makedirs(path)
        model.config.save_pretrained(path)
        torch.save(model.state_dict(), os.path.join(path, "pytorch_model.bin"))
    else:
        model.save_pretrained(path, max_shard_size="100KB" if layout == "shards" else "5GB")
        assert os.path.isfile(os.path.join(path, "model.safetensors.index.json")) == (layout == "shards")
    want = hf_first_loss(model)
    got = world4.run(rank_main, _job(tmp_path, "run", init_from=path))[0]["first_loss"]
    print(f"init_from ({layout}): first loss {got:.7f}, transformers' {want:.7f}")
    assert got == pytest.approx(want, rel=1e-5)
    # the comparison can fail: another model of the same shape has another loss
    assert hf_first_loss(_hf_model(seed=12)) != pytest.approx(want, rel=1e-3)


def test_an_exported_checkpoint_continues_with_the_loss_it_stopped_at(world4, tmp_path):
    steps = 3
    first = world4.run(rank_main, _job(tmp_path, "a", save_every=steps, steps=steps), FirstBatchLoss(MICRO))[0]
    stopped_at = first["hooks"]["saved"][steps]  # the trained engine's loss on the first batch
    out = str(tmp_path / "exported")
    export_hf.export_hf(os.path.join(str(tmp_path / "a"), "checkpoints", f"step{steps}"), out)
    again = world4.run(rank_main, _job(tmp_path, "b", init_from=out))[0]
    print(f"export-hf -> init_from: first loss {again['first_loss']:.7f}, the trained engine's {stopped_at:.7f}")
    assert again["first_loss"] == pytest.approx(stopped_at, rel=1e-5)
    assert first["first_loss"] != pytest.approx(stopped_at, rel=1e-3)  # training moved it: the check can fail
    from transformers import GPTNeoXForCausalLM

    assert hf_first_loss(GPTNeoXForCausalLM.from_pretrained(out).eval()) == pytest.approx(stopped_at, rel=1e-5)


def test_a_directory_of_another_shape_is_refused_on_every_rank(world4, tmp_path):
    from transformers import GPTNeoXForCausalLM

    other = ModelSpec(vocab_size=256, seq_len=32, hidden=32, heads=4, layers=2, intermediate=128)
    GPTNeoXForCausalLM(neox_config(other)).save_pretrained(str(tmp_path / "hf"))
    results = world4.run(_refusal, _job(tmp_path, "run", init_from=str(tmp_path / "hf")))
    assert all("model.hidden" in r and "hidden_size = 32" in r for r in results), results


def _refusal(spec):
    try:
        rank_main(spec)
    except HierConfigError as e:
        return str(e)
    return "no error"


def test_a_resume_loads_its_checkpoint_and_reads_no_weights(world4, tmp_path):
    path = str(tmp_path / "hf")
    _hf_model(seed=11).save_pretrained(path)
    first = world4.run(rank_main, _job(tmp_path, "run", init_from=path, save_every=2))[0]
    os.remove(os.path.join(path, "model.safetensors"))  # a chain's next link must not need them
    spec = _job(tmp_path, "run", steps=3, init_from=path, save_every=2, resume="latest")
    again = world4.run(rank_main, spec)[0]
    assert len(first["losses"]) == 2 and len(again["losses"]) == 1  # step 2 only: continued, not restarted
    refused = world4.run(_refusal, _job(tmp_path, "fresh", init_from=path))  # a fresh run does read them
    assert all("no weights in it" in r for r in refused), refused
