# Helpers sourced by the batch scripts of this folder (not run on its own).
#
# RENDER_ONLY=1: print every command that would change something (sbcast, srun, mkdir, module)
# and the environment the ranks would get, and run none of them. Used to check a Frontier job
# off Frontier; give the Slurm variables the job would have, e.g.
#   RENDER_ONLY=1 SLURM_JOB_ID=1 SLURM_NNODES=2 SLURM_JOB_NODELIST='frontier[08001-08002]' \
#       bash scripts/frontier/train.sbatch

zh_render() { [[ "${RENDER_ONLY:-0}" == "1" ]]; }

# Run a command, or print it (shell-quoted, so it can be pasted) under RENDER_ONLY=1.
zh_run() {
  if zh_render; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

zh_die() { echo "error: $*" >&2; exit 1; }

# Slurm variables the scripts rely on; a clear error instead of an empty srun argument.
zh_need_slurm() {
  local v
  for v in SLURM_JOB_ID SLURM_NNODES SLURM_JOB_NODELIST; do
    [[ -n "${!v:-}" ]] || zh_die "$v is not set: submit with sbatch (or set it under RENDER_ONLY=1)"
  done
}

# First host of the job: the rendezvous address of rank 0. scontrol expands Slurm's host list;
# off-cluster (rendering) without scontrol, the package's parser does the same.
zh_first_host() {
  local hosts
  if hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null) && [[ -n "$hosts" ]]; then
    head -n1 <<<"$hosts"
  else
    zh_render || zh_die "scontrol show hostnames '$SLURM_JOB_NODELIST' failed"
    # (only the host name may reach stdout: drop any "[date] [WARNING] ..." log line)
    python -m zeropp_hier.detect.slurm_env hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | grep -v '^\[' | head -n1
  fi
}

# The environment the ranks inherit, for the job log (and for checking a rendered job).
zh_show_env() {
  echo "--- environment for the ranks ---"
  env | grep -E '^(PATH|MASTER_ADDR|MASTER_PORT|NCCL_|FI_|MIOPEN_|OMP_NUM_THREADS|LD_LIBRARY_PATH|PYTHONPATH|ZEROPP_HIER_|HSA_|MPICH_GPU)' | sort
  echo "---"
}
