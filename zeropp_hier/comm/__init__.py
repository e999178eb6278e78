"""Process groups and the collectives that run a plan over them: the gather and reduce-scatter
drivers (``gather``, ``reduce``) over plain tensors and a ``CommPlan``, the executor that orders
their collectives, and what travels beside them: byte counters, failure guards and timeouts,
compression error feedback and numerics telemetry (through the ``hooks`` protocols). Uses
torch.distributed, not DeepSpeed (tests/dist/test_comm_drivers.py runs it without DeepSpeed)."""
