"""What the job reports while it runs: the monitors (monitor: ``metrics.jsonl``, TensorBoard, csv
and wandb through DeepSpeed's monitor), one run in them across a chain's links (monitor_run), the
end-of-run chart (chart) and the held-out evaluation (evaluate). Of the families it imports only
data (evaluate reads the val split); of the spine only the job's spec (app/spec.py)."""
