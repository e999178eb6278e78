"""``zeropp-hier checkpoint export-hf``: a checkpoint of a short real training run (4 ranks, the
frontier preset) exported as safetensors + config.json loads whole with
``GPTNeoXForCausalLM.from_pretrained`` (no missing or unexpected keys) and gives the trained
engine's logits; the zero_to_fp32.py beside the tags is the tensors-only one."""

import json
import os
import subprocess
import sys

import pytest
import torch

from zeropp_hier.app.model.models import ModelSpec
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.deepspeed.checkpoint.files import HierCheckpointError
from zeropp_hier.tools import export_hf

from ..unit.test_prepare_stream import make_tokenizer
from .ranks_export import Logits, fixed_input

STEPS, VOCAB = 3, 256
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def trained(world4, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    spec = JobSpec(
        steps=STEPS,
        micro_batch=2,
        model=ModelSpec(seq_len=32),
        save_every=STEPS,
        progress="off",
        out_dir=str(tmp / "run"),
    )
    out = world4.run(rank_main, spec, Logits(VOCAB))
    return tmp, os.path.join(str(tmp / "run"), "checkpoints"), out[0]["hooks"]["saved"][STEPS]


def _load(path):
    from transformers import GPTNeoXForCausalLM

    model, info = GPTNeoXForCausalLM.from_pretrained(path, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("shard", [None, 200_000])
def test_export_loads_whole_and_gives_the_engines_logits(trained, shard):
    tmp, ckpt, engine_logits = trained
    out = str(tmp / f"hf_{shard}")
    kw = {"max_shard_bytes": shard} if shard else {}
    done = export_hf.export_hf(os.path.join(ckpt, f"step{STEPS}"), out, **kw)
    if shard:
        assert len(done["files"]) > 1 and os.path.isfile(os.path.join(out, export_hf.INDEX))
    else:
        assert done["files"] == [export_hf.SINGLE]
    config = json.loads(open(os.path.join(out, "config.json")).read())
    assert config["architectures"] == ["GPTNeoXForCausalLM"] and config["vocab_size"] == VOCAB
    model, info = _load(out)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        logits = model(input_ids=fixed_input(VOCAB)).logits
    assert logits.shape == engine_logits.shape
    worst = float((logits - engine_logits).abs().max())
    print(f"export-hf (shard {shard}): largest logit difference to the engine {worst:.3g}")
    assert worst <= 1e-4, worst
    # the comparison can fail: an untrained model of the same config gives other logits
    from transformers import GPTNeoXForCausalLM

    torch.manual_seed(1)
    with torch.no_grad():
        other = GPTNeoXForCausalLM(model.config).eval()(input_ids=fixed_input(VOCAB)).logits
    assert float((other - engine_logits).abs().max()) > 1e-2


def test_the_cli_and_its_refusals(trained, capsys):
    from zeropp_hier.__main__ import main

    tmp, ckpt, _ = trained
    out = str(tmp / "cli")
    tok = make_tokenizer(tmp / "tokenizer.json", ["a b c d"], specials=("<pad>", "<|endoftext|>"))
    assert main(["checkpoint", "export-hf", ckpt, "--out", out, "--dtype", "bf16", "--tokenizer", tok]) == 0  # latest
    assert "from_pretrained" in capsys.readouterr().out
    model, info = _load(out)
    assert next(model.parameters()).dtype == torch.bfloat16 and not info["missing_keys"]
    assert model.config.eos_token_id == model.config.bos_token_id == 1  # the tokenizer's <|endoftext|>
    assert open(os.path.join(out, "tokenizer.json")).read() == open(tok).read()
    assert main(["checkpoint", "export-hf", ckpt, "--out", out]) == 1  # never over an export
    assert "not empty" in capsys.readouterr().out
    with pytest.raises(HierCheckpointError, match="no such directory"):
        export_hf.export_hf(str(tmp / "none"), str(tmp / "x"))
    with pytest.raises(HierConfigError, match="--dtype"):
        export_hf.export_hf(ckpt, str(tmp / "x"), dtype="int8")
    assert not os.path.exists(str(tmp / "x")) and not os.path.exists(str(tmp / "x.tmp-export"))


def test_zero_to_fp32_beside_the_tags_is_the_tensors_only_one(trained):
    from safetensors.torch import load_file

    from zeropp_hier.deepspeed import checkpoint

    tmp, ckpt, _ = trained
    script = os.path.join(ckpt, "zero_to_fp32.py")
    text = open(script).read()
    assert "fp32_script_main" in text and "weights_only" not in text
    assert "fp32_script_main" in open(os.path.join(ckpt, "zero_to_torch.py")).read()
    out = str(tmp / "fp32")
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, script, ckpt, out, "-t", f"step{STEPS}"], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = load_file(os.path.join(out, export_hf.SINGLE))
    want = checkpoint.to_fp32(ckpt, f"step{STEPS}")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
