"""The project's own measurements and arithmetic on one machine's CPUs (no root, no GPU); their
figures are the ones docs/benchmarks.md quotes.

- kernels (``python -m benchmarks.cpu.kernels``): the CPU quantization kernels' throughput beside
  the PyTorch reference and a memory copy; ``benchmarks/results/kernels.json``.
- rotation_instructions (``python -m benchmarks.cpu.rotation_instructions``): the block
  rotation's cost in instructions (valgrind's callgrind, load-independent), rotated against plain
  quantize/dequantize; ``benchmarks/results/rotation_instructions.json``.
- convergence (``python -m benchmarks.cpu.convergence``): the job on real text under each
  compression scheme, held-out loss against stock ZeRO-3; ``benchmarks/results/convergence*.json``
  and ``convergence.png``.
- grad_error (``python -m benchmarks.cpu.grad_error``): each gradient-reduce pipeline (the
  presets, int4 network stages with feedback or rotation, DeepSpeed's qgZ) against the exact
  mean on real gradients of 16 simulated ranks; ``benchmarks/results/grad_error_<shape>.json`` and
  ``.md``.
- paired (``python -m benchmarks.cpu.paired.run``): the paired convergence test, arms against
  stock at the same seeds with an A/A control and a margin fixed in advance;
  ``benchmarks/results/paired.json``.
- universal_rate (``python -m benchmarks.cpu.universal_rate``): the universal conversion's bytes
  and seconds, in shares and in one process (printed).
- wire_frontier (``python -m benchmarks.cpu.wire_frontier``): each node's uplink bytes per step on
  Frontier under zeropp and frontier, by phase, from the planner's link model (printed).
- layer_cost: which kernels the frontier preset runs for one layer and the GPU-to-GCD scaling,
  pure arithmetic that benchmarks/gpu/layer_cost.py measures against.
- tick_peers (``python -m benchmarks.cpu.tick_peers``): a rank's tick peers and ops per grouped
  call at 9,408 nodes by the pure schedule; ``benchmarks/results/tick_peers.json``.
- tick_work: the ticks and the bytes encoded and decoded of one layer's tick-mode work, the
  schedule and plan that benchmarks/gpu/tick_work.py's run must match (pure arithmetic).
"""
