"""The main job: train the small GPT and report bytes per tier. Two front ends, the Hydra app
(train, configs/) and plain flags (demo), share job and training."""
