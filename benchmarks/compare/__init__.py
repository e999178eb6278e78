"""The fair fight and its reports: stock ZeRO-3, ZeRO++ and the hierarchy trained side by side on
the emulated cluster (needs root), a tool a user runs to check the claim.

- run: ``sudo python -m benchmarks.compare`` (the same as ``python -m zeropp_hier cluster compare``):
  every configuration in one world on shaped links, measured steps in rotating order;
  ``benchmarks/results/compare*.json`` and ``.png`` (``compare_fair*``, ``compare_link_bound*``,
  ``compare_auto_*``, ``compare_zeropp_*``: the recorded runs).
- rank: what every rank runs inside the cluster; variants, shapes, schemes: the configurations,
  model shapes and compression schemes compared (schemes also serve benchmarks/cpu/convergence.py).
- report, linkuse, planner (``python -m benchmarks.compare.planner FILE.json``): the report, the
  tiers' busy fractions and link bound, the planner's prediction beside a recorded run.
- wire_links (``sudo python -m benchmarks.compare.wire_links``): ``comm_stats``' link view
  against the cluster's wire counters; ``benchmarks/results/wire_links_<n>x<p>x<g>.json``.
- bytes_per_tier (``python -m benchmarks.compare.bytes_per_tier``): bytes per tier per step of
  each preset on 8 local CPU ranks, exact; ``benchmarks/results/bytes_per_tier.json``.
- cross_shapes (``sudo python -m benchmarks.compare.cross_shapes``): one run at 8x1x2 and one at
  2x4x2 in the GPU issue mode, links binding then unshaped, with the planner and ``auto`` beside
  them; ``benchmarks/results/compare_shapes_<shape>.json``, ``compare_shapes.json`` and ``.md``.
"""
