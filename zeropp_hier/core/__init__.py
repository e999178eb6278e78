"""The model of a job, as pure logic: topology, config sections, compression policy, the
communication plan, tensor layouts, errors. No process groups and no DeepSpeed: importing any
module here imports neither (tests/unit/test_lazy_imports.py checks it)."""
