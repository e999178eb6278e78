"""Rank-side hook of tests/dist/test_pretrained.py: after a save, the trained engine's loss on
the first synthetic batch of every rank (the batch a new job starts with), averaged over the
ranks as the job's step loss is."""

import torch

from zeropp_hier.app.data.tokens import synthetic_batch


class FirstBatchLoss:
    def __init__(self, micro_batch: int):
        self.micro_batch = micro_batch

    def loaded(self, engine):
        return None

    def saved(self, engine, step):
        import torch.distributed as dist

        x, y = synthetic_batch(engine.module.config, self.micro_batch, 0, dist.get_rank())
        engine.eval()
        with torch.no_grad():
            loss = engine(x, y).detach().double().reshape(1)
        engine.train()
        dist.all_reduce(loss)
        return float(loss) / dist.get_world_size()
