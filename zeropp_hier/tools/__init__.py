"""Command-line tools behind the ``zeropp-hier`` subcommands: ``plan`` and ``probe`` (cli; the
arithmetic is ``zeropp_hier.planner``) and the sweep comparison table (sweep_report)."""
