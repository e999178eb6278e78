"""The benchmark's GPT shapes: the job's GPT-NeoX (``zeropp_hier.app.model.models``) in sizes that 16
CPU ranks on two cores can still train, differing in the three things that move the byte and
time balance between tiers: hidden size (bytes per gather and per gradient bucket), depth (how
many gathers per step, each paying latency and block padding) and vocabulary (the one large
embedding and head beside small blocks). ``benchmarks.compare --shape NAME`` picks one.

- ``base``: hidden 256 x 4 layers, vocabulary 1024 (3.68M parameters), the default;
- ``narrow-deep``: hidden 128 x 16 layers, vocabulary 512 (3.31M): many small gathers;
- ``wide-shallow``: hidden 384 x 2 layers, vocabulary 2048 (5.12M): few large gathers, half the
  parameters in the embedding and head.

Every shape has 64-dimensional heads, an MLP of 4 x hidden and 64 tokens per sample.
"""

from __future__ import annotations

from zeropp_hier.app.spec import ModelSpec

SHAPES: dict[str, ModelSpec] = {
    "base": ModelSpec(vocab_size=1024, seq_len=64, hidden=256, heads=4, layers=4, intermediate=1024),
    "narrow-deep": ModelSpec(vocab_size=512, seq_len=64, hidden=128, heads=2, layers=16, intermediate=512),
    "wide-shallow": ModelSpec(vocab_size=2048, seq_len=64, hidden=384, heads=6, layers=2, intermediate=1536),
}
DEFAULT_SHAPE = "base"


def planner_model(spec: ModelSpec) -> dict:
    """The shape as the benchmark's JSON records it under ``plan["model"]`` (the keys the planner
    inputs and earlier result files use)."""
    return {
        "vocab_size": spec.vocab_size,
        "seq_len": spec.seq_len,
        "d_model": spec.hidden,
        "n_heads": spec.heads,
        "n_layers": spec.layers,
    }
