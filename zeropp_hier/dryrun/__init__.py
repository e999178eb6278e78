"""A dry run at any size: one rank of an N-node job in one process, on PyTorch's fake process
group, with the real engine, job, checkpoint and data code (docs/usage.md, "Dry run at any size").

- ``zeropp-hier train ... dryrun.nodes=N [dryrun.rank=R]``: the job (``job.dry_run_job``);
- ``start(nodes, rank)`` ... ``finish()`` around a user's own script (``script.py``), or
  ``python -m zeropp_hier.dryrun --nodes N [--rank R] script.py [args]``.
"""
