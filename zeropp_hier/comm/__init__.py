"""Process groups and the collectives that run a plan over them, with what travels beside them:
byte counters, failure guards and timeouts, compression error feedback and numerics telemetry.
Uses torch.distributed, not DeepSpeed."""
