"""Every rendered table by name, and the Markdown files scanned for their markers. A marker whose
name is not here, or a name here marked nowhere, is an error (render.check says which)."""

from __future__ import annotations

from collections.abc import Callable

from . import auto, convergence, dryrun, dsunit, gpu, headline, kernels, paired, peers, probe, shapes, tier_bytes, wire

TABLES: dict[str, Callable[[], str]] = {
    "headline": headline.render,
    "bytes-payload": tier_bytes.payload_view,
    "bytes-link": tier_bytes.link_view,
    "bytes-phases-8x1x2": tier_bytes.phases_8x1x2,
    "wire-links": wire.render,
    "convergence-seed0": convergence.seed0,
    "paired": paired.render,
    "paired-v2": paired.render_v2,
    "shapes": shapes.render,
    "auto-four-cases": auto.four_cases,
    "auto-unshaped": auto.unshaped_two_rounds,
    "cpu-kernels": kernels.render,
    "gloo-probe": probe.render,
    "tick-peers": peers.render,
    "dryrun": dryrun.render,
    "dryrun-ratios": dryrun.ratios,
    "dryrun-neox20b": dryrun.neox20b,
    "gpu-kernels": gpu.kernels,
    "gpu-engine": gpu.engine,
    "gpu-dryrun": gpu.dryrun,
    "dsunit-readme": dsunit.with_rerun,
    "dsunit-first": dsunit.first_run,
    "dsunit-overlap": dsunit.overlap_sample,
}
DOCS = ("README.md", "docs/*.md")
