"""The local launcher: worlds of CPU processes on one machine (``world``: ``LocalWorld``,
``SharedWorld``) with the DeepSpeed shared-memory fix they need (``shm_hygiene``). The main job
starts its ranks with it (``zeropp-hier train`` without ``launcher=srun``); the tests and the
benchmarks run their process worlds on it."""
