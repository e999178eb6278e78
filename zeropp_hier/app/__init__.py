"""The main job: train a GPT and report bytes per tier, run as ``zeropp-hier train`` (the Hydra
app: train, configs/). The job's typed spec and the DeepSpeed config it implies (spec); one rank
building, training, measuring, resuming and saving (run); rank 0's lines and files (report);
starting the ranks (launch); the recipes' warning and the written DeepSpeed config (recipe); the
user's DeepSpeed keys merged and checked (user_config). The models are ``transformers``' GPT-NeoX
in named sizes (models) or the hand-written GPT (gpt); the data are token files, the offline text
of the standard library or synthetic batches (data)."""
