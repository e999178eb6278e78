"""The number formats and the Markdown table the renderers share, so one figure reads the same
in every table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub Markdown table; each cell is ``str(cell)``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(header):
            raise ValueError(f"a row of {len(cells)} cells under a header of {len(header)}: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ratio(x: float) -> str:
    """A speed ratio: ``1.46×``."""
    return f"{x:.2f}×"


def signed_pct(x: float, digits: int = 2) -> str:
    """A relative difference given as a fraction: ``+1.17%``, ``−0.99%`` (a minus sign)."""
    s = f"{x * 100:+.{digits}f}%"
    return s.replace("-", "−")


def pct(x: float) -> str:
    """A share: ``87%``."""
    return f"{x * 100:.0f}%"


def secs(x: float) -> str:
    return f"{x:.2f}"


def mb(x: float) -> str:
    """Bytes as MB (10^6) with two decimals; a few bytes below zero (counters less estimated
    headers on an idle link) print as 0.00, not -0.00."""
    s = f"{x / 1e6:.2f}"
    return "0.00" if s == "-0.00" else s


def kb(x: float) -> str:
    """Bytes as KB (10^3) with one decimal."""
    return f"{x / 1e3:.1f}"


def sci(x: float) -> str:
    """Two significant digits in scientific notation without a padded exponent: ``8.8e-8``."""
    return f"{x:.1e}".replace("e-0", "e-").replace("e+0", "e+")


def code(name: str) -> str:
    return f"`{name}`"


def shape_label(nodes: int, gpus: int, gcds: int) -> str:
    return f"{nodes} × {gpus} × {gcds}"
