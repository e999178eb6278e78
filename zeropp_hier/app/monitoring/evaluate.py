"""The job's evaluation: the mean loss over ``eval_batches`` micro-batches of the prepared data's
``val`` split (held-out documents), every ``eval_every`` steps.

Each rank reads its own share of the val samples (``Loader``, sharded as training is) and the
sum of the losses is all-reduced, so every rank ends with the same number. Under ZeRO-3 a forward
gathers each layer's weights with collectives on every rank, so every rank runs exactly
``eval_batches`` forwards, in the same order; the loader wraps a small val split round, so no
rank ever runs out of batches before another.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...core.errors import HierConfigError
from ..data.tokens import Loader, open_tokens
from ..spec import JobSpec


def val_loader(spec: JobSpec, rank: int, world: int) -> Loader | None:
    """This rank's val batches, or None when the job does not evaluate. Built before the model,
    so that a val split too small for one sample costs nothing."""
    if not spec.eval_every:
        return None
    assert spec.data_path is not None  # JobSpec.check: eval_every needs data
    val = open_tokens(spec.data_path, "val", spec.data_split, spec.seed)  # a pair without data.split refuses
    if val.samples(spec.model.seq_len) < 1:
        raise HierConfigError(
            "eval_every",
            spec.eval_every,
            f"the val split of {spec.data_path} has {val.count} tokens, fewer than one sample of "
            f"seq_len + 1 = {spec.model.seq_len + 1}: prepare more documents (every "
            "20th input file is held out) or set eval_every=0",
        )
    return Loader(val, spec.model.seq_len, spec.micro_batch, rank, world, spec.seed)


def val_loss(engine, loader: Loader, batches: int) -> float:
    """The mean loss over ``batches`` micro-batches of every rank (collective: every rank runs
    ``batches`` forwards and one all-reduce). The same batches each time it is called, so that
    the values of one run compare. The model is put back into training mode afterwards."""
    engine.eval()
    total = 0.0
    try:
        with torch.no_grad():
            for i in range(batches):
                x, y = loader.batch(i)
                total += float(engine(x.to(engine.device), y.to(engine.device)).detach().float())
    finally:
        engine.train()
    t = torch.tensor([total], dtype=torch.float64, device=engine.device)  # NCCL takes device tensors only
    dist.all_reduce(t)
    return float(t) / (batches * dist.get_world_size())
