"""The benchmark's markdown table, from its results file."""

from __future__ import annotations


def _f(x: float) -> str:
    return f"{x:.2e}" if 0 < abs(x) < 1e-3 else f"{x:.4f}"


def markdown(result: dict) -> str:
    m = result["model"]
    lines = [
        "# Gradient error of each reduce pipeline against the exact fp32 mean",
        "",
        f"`{result['command']}` at {result['git_commit'][:10]}: GPT-NeoX of {m['parameters'] / 1e6:.2f}M parameters "
        f"(hidden {m['hidden']}, {m['layers']} layers, byte-level), Python stdlib tokens, {result['world']} simulated "
        f"ranks x {result['micro_batch']} x {m['seq_len']} tokens, trained with the exact mean "
        f"(AdamW lr {result['lr']}); windows of {result['window']} consecutive steps after {result['points']} "
        f"steps; error feedback kept across a "
        f"window's steps. rel = ||g^-g||/||g|| (mean over the window), cos = its cosine (min over the window), "
        f"bias = ||sum(g^-g)||/||sum g|| over the window. {result['machine']}; {result['seconds']:.0f} s.",
        "",
    ]
    points = result["results"]
    for shape in points[0]["shapes"]:
        names = list(points[0]["shapes"][shape])
        head = ["configuration"]
        head += [f"rel @{p['steps_before']}" for p in points]
        head += [f"bias @{p['steps_before']}" for p in points]
        head += ["cos min"]
        lines += [
            f"## {shape} (nodes x packages x GCDs)",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for n in names:
            cells = [n]
            cells += [_f(p["shapes"][shape][n]["rel_error_mean"]) for p in points]
            cells += [_f(p["shapes"][shape][n]["accumulated_bias"]) for p in points]
            cells += [f"{min(p['shapes'][shape][n]['cosine_min'] for p in points):.5f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
