"""A run longer than one allocation: the checkpoint a job saves and resumes from, at the same or
another world size (resume, with the pure rules a resume checks: resume_rules), what its file I/O
cost (io_cost), saving before Slurm's wall clock ends (deadline) and a chain of jobs that continue
one another (chain). Imports no other family; of the spine only the job's spec (app/spec.py)."""
