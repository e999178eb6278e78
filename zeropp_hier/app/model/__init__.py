"""The job's models: ``transformers``' GPT-NeoX in named sizes, built partitioned (models), the
hand-written GPT (gpt), GPT-NeoX's initial weights (init_schemes), a Hugging Face directory's
weights as the initial ones (pretrained) and the model FLOPs, TFLOP/s and MFU of a step (flops).
Imports no other family; of the spine only the job's spec (app/spec.py: the model's fields)."""
