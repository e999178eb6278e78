"""Benchmarks and the emulated cluster, run as modules from the repository root (not installed
with the package), one folder a concern; each folder's docstring says what it measures and the
files it writes under ``benchmarks/results/``:

- compare/: the fair fight on the emulated cluster and its reports, the tool a user runs to check
  the claim (``sudo python -m benchmarks.compare``);
- gpu/: the GPU checks (``python -m benchmarks.gpu.job`` ...; scripts/gpu/check.sh runs them all);
- cpu/: the project's own measurements and arithmetic on one machine's CPUs
  (``python -m benchmarks.cpu.kernels``, ``benchmarks.cpu.convergence`` ...);
- cluster/: the emulated cluster itself (``sudo python -m benchmarks.cluster setup|status|teardown``);
- deepspeed_unit/: DeepSpeed's own ZeRO-3 unit tests with our section injected;
- tables/: the docs' tables rendered from the results (``python -m benchmarks.tables``), and the
  record of its run that every result file carries (``provenance.run_meta``).

Arrows run one way: compare/, gpu/ and cpu/ import the package, cluster/, tables/' provenance and
each other's shared definitions (compare/'s schemes, cpu/'s kernels and layer_cost), never the reverse; nothing in the
package imports benchmarks/ but ``zeropp-hier cluster`` (lazily, from the checkout)."""
