"""DeepSpeed's own ZeRO-3 unit tests run against zeropp_hier: our section injected into every
config they build (inject/), run inside an extracted copy of DeepSpeed's ``tests/`` (README.md).
Per test to ``<work>/<config>.jsonl``; summed up to ``benchmarks/results/deepspeed_unit.json``.

    nice -n 19 python benchmarks/deepspeed_unit/run.py --ds-tests /tmp/ds_src/tests
"""
