"""Topology detection for ``"topology": "auto"``: pure parsers of Slurm variables and
``rocm-smi --showtopo`` (slurm_env, rocm_topo), the pure decision (autodetect), and the rank
exchange that feeds it (probe, the one module here that uses process groups)."""
