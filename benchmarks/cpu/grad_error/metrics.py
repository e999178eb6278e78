"""The benchmark's measures of a reduced gradient g^ against the exact mean g, over a window of
consecutive steps: relative L2 error ||g^ - g|| / ||g|| and cosine similarity per step, and the
accumulated bias ||sum_t (g^_t - g_t)|| / ||sum_t g_t|| over the window (what error feedback
is for: an error that is delayed, not lost, cancels in the sum)."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got - exact).norm() / exact.norm())


def cosine(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float(torch.dot(got, exact) / (got.norm() * exact.norm()))


class Window:
    """Accumulates the measures of each named configuration over consecutive steps."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.rel: dict[str, list[float]] = {n: [] for n in names}
        self.cos: dict[str, list[float]] = {n: [] for n in names}
        self.diff: dict[str, torch.Tensor] = {}
        self.total: torch.Tensor | None = None

    def add(self, exact: Sequence[torch.Tensor], got: Mapping[str, Sequence[torch.Tensor]]) -> None:
        g = flat(exact)
        self.total = g.clone() if self.total is None else self.total.add_(g)
        for n in self.names:
            h = flat(got[n])
            self.rel[n].append(relative_error(h, g))
            self.cos[n].append(cosine(h, g))
            d = h - g
            self.diff[n] = d if n not in self.diff else self.diff[n].add_(d)

    def accumulated_bias(self, name: str) -> float:
        assert self.total is not None, "no step added"
        return float(self.diff[name].norm() / self.total.norm())

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for n in self.names:
            rel, cos = self.rel[n], self.cos[n]
            out[n] = {
                "rel_error_mean": sum(rel) / len(rel),
                "rel_error_max": max(rel),
                "cosine_mean": sum(cos) / len(cos),
                "cosine_min": min(cos),
                "accumulated_bias": self.accumulated_bias(n),
                "steps": len(rel),
            }
        return out
