"""Gradient-error benchmark: each compression pipeline of the gradient reduce against the exact
fp32 mean, on real gradients, in one process.

    python -m benchmarks.cpu.grad_error            # both shapes, 2.5M parameters, points 0 50 150
    python -m benchmarks.cpu.grad_error --quick    # a 0.13M model, 2 + 2 steps

The defaults did not finish on the shared 2-core machine (load 20-30: one step of 16 ranks took
minutes); the committed results ran one process per shape with ``--shapes S --hidden 128
--layers 2 --points 0 10 --window 3`` (``benchmarks/results/grad_error_<shape>.*``).

16 simulated data-parallel ranks, each with its own micro-batch of the Python standard library's
tokens (the job's ``data prepare --stdlib`` files and ``Loader``), compute their gradients of the
job's GPT-NeoX (a few million parameters); the model trains on the exact mean, so every pipeline
sees the same gradients. At a few points of training, over windows of consecutive steps, every
pipeline reduces the same 16 gradients as the engine would on 2 nodes x 4 packages x 2 GCDs
and on 8 x 1 x 2 (pipelines.py: the plan's hops, the engine's row layout, the quantizer, error
feedback; rows.py: the configurations; qgz.py: DeepSpeed's qgZ reimplemented on the CPU), and
metrics.py measures each result. Writes ``benchmarks/results/grad_error.json`` (with the commit,
the defaults, the model, the steps and the machine) and ``benchmarks/results/grad_error.md``.
"""
