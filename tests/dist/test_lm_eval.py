"""A real client scores the job's model: train (4 ranks, frontier preset) on a prepared corpus
with a byte-level BPE tokenizer.json, save, ``zeropp-hier checkpoint export-hf --tokenizer``,
then lm-evaluation-harness (``lm_eval.simple_evaluate``, its ``hf`` model on the exported
directory, a local ``loglikelihood_rolling`` task over the held-out text: nothing downloaded).
Its token perplexity equals the job's own evaluation of the same text (within 1%; measured:
far closer).

[Note: the same quantity twice]
The job's evaluation (app/monitoring/evaluate.py) is the mean next-token loss over the val split's samples:
windows of seq_len + 1 tokens of the val stream at a stride of seq_len, so the stream's first
token is context only and every later token up to n x seq_len is predicted once, from the
tokens before it in its own window. lm_eval's rolling log-likelihood of one document predicts
every token of the document from disjoint windows of max_length (the exported config's
max_position_embeddings = seq_len) whose first context token is its prefix token. So the
held-out document here is one newline (a token of its own) followed by text; the job's val
stream is that document and its EOS; lm_eval scores the text and the EOS (``<|endoftext|>``
written at its end, which the tokenizer reads as the EOS id) with the newline as prefix token:
the same tokens predicted from the same contexts. The test checks that the tokens agree before
it compares the numbers, and that the document is n x seq_len tokens so that all of it is
evaluated by both (eval_batches x ranks x micro_batch = n samples, each once)."""

import math
import os

import lm_eval  # noqa: E402 - the test extra installs it (zeropp-hier[eval])
import numpy as np
import pytest

from zeropp_hier.app.data import prepare_stream
from zeropp_hier.app.data.tokens import open_tokens
from zeropp_hier.app.model.models import ModelSpec
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec
from zeropp_hier.tools import export_hf

from ..unit.test_prepare_stream import WORDS, make_tokenizer, write_jsonl

WORLD, MICRO, SEQ, SAMPLES, STEPS = 4, 2, 32, 8, 6
TASK = "zeropp_heldout"


def _train_docs(n: int, rng) -> list[str]:
    # a learnable pattern: runs of the word list from a random start
    return [" ".join(WORDS[(s + j) % len(WORDS)] for j in range(120)) for s in rng.integers(0, len(WORDS), size=n)]


def _heldout(tok, rng) -> str:
    """Text that, after a newline, is exactly SAMPLES x SEQ tokens with its EOS ([Note: the
    same quantity twice]); other words than training's order, as held-out text is."""
    words = [str(w) for w in rng.choice(WORDS, size=600)]
    for k in range(len(words)):
        rest = " ".join(words[:k])
        if len(tok.encode("\n" + rest).ids) == SAMPLES * SEQ:
            return rest
    raise AssertionError("no prefix of the words gives the token count; change the seed")


def _task_yaml(path: str, jsonl: str) -> str:
    text = f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {jsonl}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}<|endoftext|>"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, f"{TASK}.yaml"), "w") as f:
        f.write(text)
    return path


def test_lm_eval_scores_the_export_as_the_job_evaluates_it(world4, tmp_path, monkeypatch):
    from tokenizers import Tokenizer

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rng = np.random.default_rng(3)
    train = _train_docs(19, rng)
    tok_file = make_tokenizer(tmp_path / "tokenizer.json", train + [" ".join(WORDS)] * 5)
    tok = Tokenizer.from_file(tok_file)
    rest = _heldout(tok, rng)
    newline, eos = tok.token_to_id(tok.id_to_token(tok.encode("\n").ids[0])), tok.token_to_id("<|endoftext|>")
    # document 0 is held out (every 20th): the val split is exactly this one document
    corpus = write_jsonl(tmp_path / "corpus.jsonl", ["\n" + rest] + train)
    prepare_stream.prepare([corpus], str(tmp_path / "data"), tokenizer=tok_file)
    val = np.asarray(open_tokens(str(tmp_path / "data"), "val").tokens)
    scored = tok.encode(rest + "<|endoftext|>").ids  # what lm_eval's rolling windows predict
    assert val.tolist() == [newline] + scored and len(scored) == SAMPLES * SEQ and scored[-1] == eos

    spec = JobSpec(
        steps=STEPS,
        micro_batch=MICRO,
        model=ModelSpec(seq_len=SEQ),
        data_path=str(tmp_path / "data"),
        eval_every=STEPS,
        eval_batches=SAMPLES // (WORLD * MICRO),
        save_every=STEPS,
        progress="off",
        out_dir=str(tmp_path / "run"),
    )
    out = world4.run(rank_main, spec)[0]
    job_loss = out["val_losses"][STEPS - 1]
    out_dir = str(tmp_path / "hf")
    ckpt = os.path.join(str(tmp_path / "run"), "checkpoints", f"step{STEPS}")
    export_hf.export_hf(ckpt, out_dir, tokenizer=os.path.join(str(tmp_path / "data"), "tokenizer.json"))

    jsonl = write_jsonl(tmp_path / "heldout.jsonl", [rest])
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={out_dir},dtype=float32,prefix_token_id={newline}",
        tasks=[TASK],
        task_manager=TaskManager(include_path=_task_yaml(str(tmp_path / "tasks"), jsonl)),
        batch_size=1,
        device="cpu",
        log_samples=True,
    )
    (sample,) = results["samples"][TASK]
    loglikelihood = float(np.ravel(sample["filtered_resps"])[0])  # the document's summed log-likelihood
    token_ppl = math.exp(-loglikelihood / len(scored))
    job_ppl = math.exp(job_loss)
    word_ppl = results["results"][TASK]["word_perplexity,none"]
    print(f"lm_eval token perplexity {token_ppl:.6f}, the job's {job_ppl:.6f} (val loss {job_loss:.6f})")
    print(f"lm_eval word perplexity {word_ppl:.4f}")
    assert token_ppl == pytest.approx(job_ppl, rel=0.01)
    assert token_ppl < tok.get_vocab_size()  # the trained model does better than a uniform guess
