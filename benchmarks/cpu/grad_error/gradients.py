"""Real gradients for the benchmark: the job's GPT-NeoX (``app.model.models.build``, built whole
from a config, never downloaded) on the job's token files of the Python standard library
(``app.data.tokens``: ``zeropp-hier data prepare --stdlib``), one micro-batch per simulated
rank from the job's own ``Loader``, trained with the exact mean of the ranks' gradients."""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from zeropp_hier.app.data.tokens import Loader, TokenData, prepare, stdlib_files
from zeropp_hier.app.model import models
from zeropp_hier.app.spec import MODELS, ModelSpec


def model_spec(hidden: int, layers: int, heads: int, seq_len: int) -> ModelSpec:
    """The job's ``tiny`` GPT-NeoX (byte level) at the benchmark's size, 4 x hidden MLP."""
    return dataclasses.replace(
        MODELS["tiny"],
        vocab_size=256,
        seq_len=seq_len,
        hidden=hidden,
        heads=heads,
        layers=layers,
        intermediate=4 * hidden,
    )


def prepare_data(path: str) -> dict:
    """The stdlib corpus as the job's token files, prepared once (``data prepare --stdlib``)."""
    index = os.path.join(path, "index.json")
    if not os.path.exists(index):
        prepare(stdlib_files(), path, "python standard library")
    with open(index) as f:
        return json.load(f)


class Trainer:
    """``world`` simulated data-parallel ranks over one model: ``rank_grads(step)`` is each
    rank's gradient of its own micro-batch ``step``; ``apply(mean)`` takes an AdamW step with a
    given gradient (the exact mean: every pipeline then sees the same weights)."""

    def __init__(self, spec: ModelSpec, data: str, world: int, micro_batch: int, lr: float, seed: int):
        self.model = models.build(spec, {}, seed=seed)
        # the bucket's tensors in the order backward produces them (last layer first); the
        # pipelines' values do not depend on it: every tensor's chunk sits in its own blocks
        self.params = [p for p in self.model.parameters() if p.requires_grad][::-1]
        self.names = {id(p): n for n, p in self.model.named_parameters()}
        tokens = TokenData(data, "train")
        self.loaders = [Loader(tokens, spec.seq_len, micro_batch, r, world, seed) for r in range(world)]
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.world = world

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def rank_grads(self, step: int) -> tuple[list[list[torch.Tensor]], float]:
        """Each rank's gradients of its micro-batch ``step`` (fp32, ``self.params`` order), and
        the ranks' mean loss."""
        out, loss_sum = [], 0.0
        for loader in self.loaders:
            x, y = loader.batch(step)
            self.model.zero_grad(set_to_none=True)
            loss = self.model(x, y)
            loss.backward()
            loss_sum += float(loss.detach())
            out.append([p.grad.detach().clone() for p in self.params])  # type: ignore[union-attr]
        return out, loss_sum / len(self.loaders)

    def warm_step(self, step: int) -> float:
        """One training step on the exact mean gradient, computed as one batch (the world's
        micro-batches together: the same mean, one pass)."""
        xs, ys = zip(*(loader.batch(step) for loader in self.loaders))
        self.model.zero_grad(set_to_none=True)
        loss = self.model(torch.cat(xs), torch.cat(ys))
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def apply(self, grads: list[torch.Tensor]) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g.view_as(p).clone()
        self.opt.step()
