"""The main job: train a GPT and report bytes per tier, run as ``zeropp-hier train`` (the Hydra
app: train, configs/). The spine, here: the job's typed spec and the DeepSpeed config it implies
(spec); one rank building, training, measuring, resuming and saving (run); rank 0's lines and
files (report); starting the ranks (launch); the recipes' warning and the written DeepSpeed config
(recipe); the user's DeepSpeed keys merged and checked (user_config); the layout's memory check
(memory_check). The families, one sub-package each: data/ (token files, the user's corpus,
Megatron pairs and their blends), model/ (``transformers``' GPT-NeoX in named sizes, the
hand-written GPT, initial and pretrained weights, FLOPs), longrun/ (resume, checkpoint I/O cost,
Slurm deadlines, chains of jobs) and monitoring/ (monitors, one run across a chain, the chart,
evaluation). A family imports no other family but data, and of the spine only spec
(tests/unit/test_layering.py)."""
