"""Tables of measured figures in README.md and docs/*.md, rendered from committed results under
``benchmarks/results/``, so a figure cannot drift from its source; and what a result records
about its run.

- ``python -m benchmarks.tables``: rewrites every region between ``<!-- table:NAME -->`` and
  ``<!-- /table:NAME -->`` in README.md and docs/*.md with its renderer's table;
  ``--check`` only reports the regions that differ (exit 1), as tests/unit/test_doc_tables.py does.
- markers: finding and replacing the marked regions (pure);
- fmt: a Markdown table and the number formats every renderer shares;
- sources: loading a result file and its record of the run (``meta``, or for files recorded
  before runs carried one, ``benchmarks/results/provenance.json``, established from git history);
- provenance: what a benchmark writes beside its figures (``run_meta``: the commit, the defaults
  it ran under, its conditions), used by compare/'s and cpu/'s writers;
- render: every marked region of every file re-rendered, or the ones that differ reported;
- one module per kind of table: headline (the README's), shapes and auto (the two node shapes),
  tier_bytes, wire, probe (gloo's rate), convergence, kernels, peers (tick peers at 9,408 nodes),
  gpu (the H100 session), dsunit (DeepSpeed's unit tests); emulated reads a compare run for them;
  registry names every table."""
