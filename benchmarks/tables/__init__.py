"""Tables of measured figures in README.md and docs/*.md, rendered from committed results under
``benchmarks/results/`` (and ``tests/data/emulated_cluster/``), so a figure cannot drift from its
source; and what a result records about its run.

- ``python -m benchmarks.tables``: rewrites every region between ``<!-- table:NAME -->`` and
  ``<!-- /table:NAME -->`` in README.md and docs/*.md with its renderer's table;
  ``--check`` only reports the regions that differ (exit 1), as tests/unit/test_doc_tables.py does.
- markers: finding and replacing the marked regions (pure);
- fmt: a Markdown table and the number formats every renderer shares;
- sources: loading a result file and its record of the run (``meta``, or for files recorded
  before runs carried one, ``benchmarks/results/provenance.json``, established from git history);
- provenance: what a benchmark writes beside its figures (``run_meta``: the commit, the defaults
  it ran under, its conditions), used by compare/'s and cpu/'s writers;
- one module per kind of table: headline (the README's), shapes, auto, wire, tier_bytes,
  convergence, kernels; registry names them."""
