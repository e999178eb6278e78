"""Running zeropp_hier without a cluster: local CPU worlds (launch), the DeepSpeed shm fix they
need (shm_hygiene), a small GPT (models) and offline text (text). Used by the main job, the
tests and the benchmarks."""
