"""Paired convergence test (issue 60, item 3): each compression arm against stock DeepSpeed
ZeRO-3 at the same seeds (same initial weights and sample order per seed), with an A/A control
for the noise floor, 95% t-intervals of the per-seed relative differences in held-out loss and an
equivalence margin fixed beforehand in ``protocol.json`` (``PROTOCOL.md`` explains it).

- ``run`` (``python -m benchmarks.cpu.paired.run``): the runs and the table;
  ``benchmarks/results/paired.json`` (``paired_pilot.json`` for a pilot).
- ``rank``: one arm at one seed on one rank; ``protocol``: the protocol file, checked;
  ``stats``, ``analyze``: the statistics and the decision, pure.
"""
