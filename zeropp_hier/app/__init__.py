"""The main job: train a GPT and report bytes per tier. The models are ``transformers``' GPT-NeoX
in named sizes (models) or the hand-written GPT (gpt); the data are token files or the offline
text of the standard library (data, text). Two front ends, the Hydra app (train, configs/) and
plain flags (demo), share job and training."""
