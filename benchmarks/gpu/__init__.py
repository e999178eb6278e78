"""The GPU checks: what the package does on one GPU, the tools a user with a GPU node runs to
check the claims (all of them from scripts/gpu/check.sh, whose log lands in
``benchmarks/results/gpu_check_log_*.txt``).

- job (``python -m benchmarks.gpu.job``): the main job at world size 1, our exact ZeRO-3 beside
  stock; ``benchmarks/results/gpu_job*_summary.json``.
- engine (``python -m benchmarks.gpu.engine``): the engine's step on 8 ranks sharing the GPU beside
  stock DeepSpeed; ``benchmarks/results/gpu_engine.json``.
- modes (``python -m benchmarks.gpu.modes``): the issue modes on 8 ranks sharing the GPU;
  ``gpu_modes.json``.
- kernels (``python -m benchmarks.gpu.kernels``): the GPU quantization kernels' throughput beside a
  device-to-device copy; ``benchmarks/results/gpu_kernels.json``.
- layer_cost (``python -m benchmarks.gpu.layer_cost``): one 20B layer's compression kernels beside
  its compute, scaled to one MI250X GCD by benchmarks/cpu/layer_cost.py; ``gpu_layer_cost.json``.
- tick_work (``python -m benchmarks.gpu.tick_work``): the tick mode's local work per tick on one
  rank's device tensors, host time beside device time, for one 20B layer at 48 x 4 x 2, the
  network replaced by a local stand-in; ``benchmarks/results/gpu_tick_work.json``.
- dryrun (``python -m benchmarks.gpu.dryrun``): the dry run's rank 0 at 48 and 9,408 nodes with its
  engine on the GPU, its device memory beside the planner's table;
  ``benchmarks/results/gpu_dryrun_h200.json``.
"""
