"""GPT-NeoX's initial weights for the job's GPT-NeoX model: ``small_init`` and ``wang_init``
(``init_method`` / ``output_layer_init_method`` of GPT-NeoX's configs; the recipes whose source
names them set them, configs/recipe/).

[Note: GPT-NeoX's init schemes]
From EleutherAI/gpt-neox ``megatron/model/init_functions.py``: ``small_init`` is N(0, sqrt(2 / (5
hidden))) (Nguyen & Salazar, "Transformers without Tears"), ``wang_init`` N(0, 2 / (layers
sqrt(hidden))). GPT-NeoX gives ``init_method`` to the input embedding, the fused QKV projection,
the MLP's ``dense_h_to_4h`` and the output head (its ``final_linear``), and
``output_layer_init_method`` to the two projections that write into the residual stream: attention
``dense`` and MLP ``dense_4h_to_h``. ``normal`` is transformers' own N(0, initializer_range = 0.02),
which the model already has when it is built, so it is left as built. Biases and LayerNorms are
what both give them (zero; one and zero).

The model is partitioned while it is built (models.py), so a weight is drawn whole, one matrix at
a time, on rank 0 from a generator seeded by the job's seed and the weight's index, inside
``GatheredParameters(modifier_rank=0)``, which sends it to the other ranks and re-partitions it:
the same seed gives the same weights on any number of ranks. The most a rank holds is one matrix.

``stds`` is pure (which weight gets which standard deviation); ``apply`` draws them.
"""

from __future__ import annotations

import math
from typing import Iterable

from ...core.errors import HierConfigError

INIT_METHODS = ("normal", "small_init")
OUTPUT_LAYER_INIT_METHODS = ("normal", "wang_init")
# transformers' GPTNeoXForCausalLM parameter names, by the GPT-NeoX scheme each one takes
_INPUT_SIDE = (
    "gpt_neox.embed_in.weight",
    ".attention.query_key_value.weight",
    ".mlp.dense_h_to_4h.weight",
    "lm_head.weight",
    "embed_out.weight",  # transformers 4's name of the head
)
_OUTPUT_SIDE = (".attention.dense.weight", ".mlp.dense_4h_to_h.weight")


def small_init_std(hidden: int) -> float:
    return math.sqrt(2.0 / (5.0 * hidden))


def wang_init_std(hidden: int, layers: int) -> float:
    return 2.0 / layers / math.sqrt(hidden)


def check(init_method: str, output_layer_init_method: str, arch: str) -> None:
    """Refuse an unknown scheme, or a GPT-NeoX scheme for the hand-written GPT."""
    for field, value, allowed in (
        ("init_method", init_method, INIT_METHODS),
        ("output_layer_init_method", output_layer_init_method, OUTPUT_LAYER_INIT_METHODS),
    ):
        if value not in allowed:
            raise HierConfigError(field, value, f"use one of {list(allowed)} (GPT-NeoX's names)")
        if value != "normal" and arch != "neox":
            raise HierConfigError(
                field, value, f"GPT-NeoX's schemes apply to model.arch=neox (this model is arch {arch}); use normal"
            )


def stds(names: Iterable[str], hidden: int, layers: int, init_method: str, output_layer_init_method: str) -> dict:
    """{parameter name: standard deviation} for each weight the schemes redraw (pure); a weight
    left out keeps the value it was built with."""
    out = {}
    for name in names:
        if init_method == "small_init" and any(name.endswith(s) for s in _INPUT_SIDE):
            out[name] = small_init_std(hidden)
        elif output_layer_init_method == "wang_init" and any(name.endswith(s) for s in _OUTPUT_SIDE):
            out[name] = wang_init_std(hidden, layers)
    return out


def apply(model, hidden: int, layers: int, init_method: str, output_layer_init_method: str, seed: int) -> int:
    """Redraw the weights ``stds`` names in ``model`` (built by models.build; collective when it is
    partitioned: every rank must call it). Returns how many weights were redrawn."""
    if init_method == "normal" and output_layer_init_method == "normal":
        return 0
    import torch

    params = dict(model.named_parameters())
    chosen = stds(params, hidden, layers, init_method, output_layer_init_method)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    for index, (name, std) in enumerate(sorted(chosen.items())):
        p = params[name]
        gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
        if hasattr(p, "ds_id"):  # partitioned: draw it whole on rank 0, DeepSpeed scatters it
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=0), torch.no_grad():
                if rank == 0:
                    p.copy_(torch.empty(p.shape).normal_(0.0, std, generator=gen))
        else:
            with torch.no_grad():
                p.copy_(torch.empty(p.shape).normal_(0.0, std, generator=gen))
    return len(chosen)
