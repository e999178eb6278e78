"""A small GPT for CPU runs and tests: tied input/output embedding, pre-norm blocks with
multi-head causal attention and a GELU MLP, biases everywhere. Default sizes are chosen so that
most parameter sizes are *not* divisible by 8 (the workhorse world size), which exercises the
padding of every shard layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 101
    seq_len: int = 16
    d_model: int = 36
    n_heads: int = 3
    n_layers: int = 2
    # GPT-2 ties the output head to the input embedding. A tied weight is used again outside its
    # module, and DeepSpeed fetches such "external" parameters through its own stock gather, not
    # the hierarchy's: untie it where every use of a weight must see the same compressed gather.
    tie_embeddings: bool = True


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_heads = c.n_heads
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model)
        self.out = nn.Linear(4 * c.d_model, c.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, seq, d_model]
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig = GPTConfig()):
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab_size, c.d_model)
        self.wpe = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init)
        # activation checkpointing per block: "none", "torch" (torch.utils.checkpoint,
        # non-reentrant) or "deepspeed" (deepspeed.checkpointing.checkpoint, as Megatron calls it)
        self.checkpoint = "none"

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):  # idx: [batch, seq]
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            if self.checkpoint == "torch" and self.training:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(blk, x, use_reentrant=False)
            elif self.checkpoint == "deepspeed" and self.training:
                import deepspeed

                x = deepspeed.checkpointing.checkpoint(blk, x)
            else:
                x = blk(x)
        if self.head is None:  # output head tied to the input embedding (GPT-2 style)
            logits = F.linear(self.ln_f(x), self.wte.weight)
        else:
            logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
