"""Rank-side hook of tests/dist/test_export_hf.py: the trained engine's logits on a fixed input,
taken after each save (every rank runs the forward: ZeRO-3 gathers the weights)."""

import torch

INPUT_SHAPE = (2, 24)


def fixed_input(vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab, INPUT_SHAPE, generator=g)


class Logits:
    def __init__(self, vocab: int):
        self.vocab = vocab

    def loaded(self, engine):
        return None

    def saved(self, engine, step):
        import torch.distributed as dist

        with torch.no_grad():
            logits = engine(fixed_input(self.vocab))
        return logits.float().cpu() if dist.get_rank() == 0 else None
