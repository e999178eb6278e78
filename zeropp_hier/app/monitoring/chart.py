"""The job's end-of-run chart: loss and tokens/s per step (``metrics.jsonl``'s rows), one PNG
beside ``summary.json``, written atomically (a reader never sees half a file).

matplotlib is a dependency of the package; it is imported here only, when the chart is drawn, so
that importing the job costs nothing; a bare ``Figure`` draws with Agg and needs no display.
"""

from __future__ import annotations

import io
import os
from typing import Sequence

from ...files import write_atomic


def render(rows: Sequence[dict], title: str = "") -> bytes:
    """PNG bytes of two panels: the loss (mean over ranks) and the tokens/s of every step."""
    if not rows:
        raise ValueError("no steps to chart: the job trained none")
    # a Figure, not pyplot: no display, no backend switch, no global state across calls
    from matplotlib.figure import Figure

    steps = [r["step"] for r in rows]
    fig = Figure(figsize=(8, 3.2), dpi=100)
    loss_ax, tput_ax = fig.subplots(1, 2)
    loss_ax.plot(steps, [r["loss"] for r in rows], marker=".", color="tab:blue")
    loss_ax.set(xlabel="step", ylabel="loss (mean over ranks)", title="loss")
    tput_ax.plot(steps, [r["tokens_per_s"] for r in rows], marker=".", color="tab:orange")
    tput_ax.set(xlabel="step", ylabel="tokens/s (all ranks)", title="throughput")
    tput_ax.set_ylim(bottom=0)
    for ax in (loss_ax, tput_ax):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write(rows: Sequence[dict], out_dir: str, title: str = "", name: str = "metrics.png") -> str:
    """Write the chart as ``out_dir/name`` atomically; returns the path."""
    path = os.path.join(out_dir, name)
    write_atomic(path, render(rows, title))
    return path
