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

# Frontier: the packed environment (ZH_ENV_TARBALL, made by install.sh) on node-local NVMe (-C nvme
# mounts /mnt/bb/$USER on every node): broadcast, unpacked and relocated with conda-unpack, run by
# the environment's own python (OLCF runs it in the activated environment), as OLCF's "Sbcast
# Conda Environments" guide does. Sets LOCAL_ENV, puts its bin first on PATH, and makes ZH_PY its
# python with -P (the checkout in the submit directory stays off sys.path). Needs env.sh first.
zh_stage_env() {
  : "${ZH_ENV_TARBALL:=${MEMBERWORK:-$HOME}/zeropp-hier-env.tar.gz}"
  LOCAL_ENV="/mnt/bb/${USER:-user}/zeropp-hier-env"
  if ! zh_render && [[ ! -f "$ZH_ENV_TARBALL" ]]; then
    zh_die "ZH_ENV_TARBALL=$ZH_ENV_TARBALL not found; create it with scripts/frontier/install.sh"
  fi
  zh_run sbcast --force "$ZH_ENV_TARBALL" "/mnt/bb/${USER:-user}/zeropp-hier-env.tar.gz"
  zh_run srun -N "$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c \
    "mkdir -p '$LOCAL_ENV' '$MIOPEN_USER_DB_PATH' && tar -xzf '/mnt/bb/${USER:-user}/zeropp-hier-env.tar.gz' -C '$LOCAL_ENV' && '$LOCAL_ENV/bin/python' '$LOCAL_ENV/bin/conda-unpack'"
  export PATH="$LOCAL_ENV/bin:$PATH"
  ZH_PY=("$LOCAL_ENV/bin/python" -P)
}

# The rendezvous port of job $1 ([Note: ports below the ephemeral range] in zeropp_hier/launch/ports.py):
# below this host's ephemeral range ($2, or the first port of net.ipv4.ip_local_port_range), where
# srun's and slurmstepd's own sockets cannot take it; 64 ports short of it, for compare.sbatch's steps.
# Run on the batch host and exported, so every rank gets the one port.
zh_master_port() {
  local job=$1 low=${2:-} base=20000 span
  [[ -n "$low" ]] || read -r low _ < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
  (( low - 64 - base >= 256 )) || base=1024
  span=$((low - 64 - base))
  if (( span < 256 )); then
    echo "zh_master_port: net.ipv4.ip_local_port_range starts at $low: fewer than 256 ports below it for the rendezvous; set ZH_MASTER_PORT to a port no process on the first node uses" >&2
    return 1
  fi
  echo $((base + job % span))
}

# The environment the ranks inherit, for the job log (and for checking a rendered job).
zh_show_env() {
  echo "--- environment for the ranks ---"
  env | grep -E '^(PATH|MASTER_ADDR|MASTER_PORT|NCCL_|FI_|MIOPEN_|OMP_NUM_THREADS|LD_LIBRARY_PATH|PYTHONPATH|ZEROPP_HIER_|HSA_|MPICH_GPU)' | sort
  echo "---"
}

# -- chained jobs ([Note: chained jobs] in zeropp_hier/app/longrun/chain.py) --------------------------------
# A job given checkpoint_dir= and steps= is one link of a chain: it asks the chain whether to run
# (done / stopped / resume / fresh), submits its successor with a dependency on itself, runs, and
# records how it ended. Without those two overrides (or with ZH_CHAIN=0) the job runs once.

# The python that runs the chain's helper (a script may point it at its own environment).
ZH_PY=(python)

# ZH_CHAIN_DIR and ZH_CHAIN_STEPS from the job's overrides; false when the chain is off. A resume=
# or save_every= the user gave is kept (the chain then adds none).
zh_chain_on() {
  ZH_CHAIN_DIR="" ZH_CHAIN_STEPS="" ZH_USER_RESUME="" ZH_USER_SAVE_EVERY=""
  local a
  for a in "$@"; do
    case "$a" in
      checkpoint_dir=*) ZH_CHAIN_DIR=${a#checkpoint_dir=} ;;
      steps=*) ZH_CHAIN_STEPS=${a#steps=} ;;
      resume=*) ZH_USER_RESUME=$a ;;
      save_every=*) ZH_USER_SAVE_EVERY=$a ;;
    esac
  done
  if [[ -z "$ZH_CHAIN_DIR" || -z "$ZH_CHAIN_STEPS" || "${ZH_CHAIN:-1}" == "0" ]]; then
    echo "chain: off (give checkpoint_dir= and steps= to chain jobs until the run is done; ZH_CHAIN=0 turns it off)"
    ZH_CHAIN_DIR=""
    return 1
  fi
}

# A field of this job's `scontrol show job` record (TimeLimit, StdOut, ...), or nothing.
zh_job_field() {
  scontrol show job "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n1
}

# At the start of a link: sets ZH_EXTRA, the overrides the chain adds: resume=latest when there is
# a complete checkpoint (the chain says whether it resumes or starts fresh), and save_every=<steps>
# when none was given (the run's last step must be saved, or the next link would redo it). Ends the
# job when the run is done (exit 0) or the chain stopped (exit 1).
zh_chain_start() {
  ZH_EXTRA=()
  [[ -n "$ZH_USER_SAVE_EVERY" ]] || ZH_EXTRA+=("save_every=$ZH_CHAIN_STEPS")
  if zh_render; then
    zh_run "${ZH_PY[@]}" -m zeropp_hier.app.longrun.chain start --dir "$ZH_CHAIN_DIR" --steps "$ZH_CHAIN_STEPS" --job "$SLURM_JOB_ID"
    return 0
  fi
  local rc=0 resume
  resume=$("${ZH_PY[@]}" -m zeropp_hier.app.longrun.chain start --dir "$ZH_CHAIN_DIR" --steps "$ZH_CHAIN_STEPS" \
    --job "$SLURM_JOB_ID") || rc=$?
  case "$rc" in
    0) [[ -n "$ZH_USER_RESUME" || -z "$resume" ]] || ZH_EXTRA+=("$resume") ;; # the user's resume= stands
    10) echo "chain: done, nothing to run"; exit 0 ;;
    11) echo "chain: stopped"; exit 1 ;;
    *) zh_die "the chain's helper (python -m zeropp_hier.app.longrun.chain start) failed (exit $rc)" ;;
  esac
}

# Submit the next link (this script, the same overrides) to start once this job has ended,
# however it ends (afterany: also at its time limit or on a node failure). Sets ZH_NEXT.
zh_chain_submit_next() {
  local script=$1; shift
  local workdir
  workdir=$(zh_job_field WorkDir) && [[ -n "$workdir" ]] || workdir=$PWD # this job's, not its submitter's
  local args=(--parsable "--dependency=afterany:$SLURM_JOB_ID" -N "$SLURM_NNODES" -D "$workdir")
  [[ -n "${SLURM_JOB_NAME:-}" ]] && args+=(-J "$SLURM_JOB_NAME")
  [[ -n "${SLURM_JOB_ACCOUNT:-}" ]] && args+=(-A "$SLURM_JOB_ACCOUNT")
  [[ -n "${SLURM_NTASKS_PER_NODE:-}" ]] && args+=("--ntasks-per-node=$SLURM_NTASKS_PER_NODE")
  local limit out
  limit=$(zh_job_field TimeLimit) && [[ -n "$limit" && "$limit" != UNLIMITED ]] && args+=(-t "$limit")
  # the same output file pattern: this job's, its id in the file name made %j again
  out=$(zh_job_field StdOut) && [[ -n "$out" ]] && args+=(-o "${out%/*}/$(zh_id_to_pattern "${out##*/}")")
  if zh_render; then
    zh_run sbatch "${args[@]}" "$script" "$@"
    ZH_NEXT=""
    return 0
  fi
  ZH_NEXT=$(sbatch "${args[@]}" "$script" "$@") || zh_die "could not submit the next link of the chain"
  ZH_NEXT=${ZH_NEXT%%;*}
  echo "chain: submitted the next link, job $ZH_NEXT (starts after job $SLURM_JOB_ID ends)"
}

# A file name with this job's id as Slurm's %j again (job-123.out -> job-%j.out).
zh_id_to_pattern() {
  local name=$1
  echo "${name//$SLURM_JOB_ID/%j}"
}

# At the end of a link: record how it ended; cancel the next link when the run is done or stopped.
zh_chain_end() {
  local rc=$1 next=0
  zh_render && return 0
  "${ZH_PY[@]}" -m zeropp_hier.app.longrun.chain end --dir "$ZH_CHAIN_DIR" --steps "$ZH_CHAIN_STEPS" --job "$SLURM_JOB_ID" \
    --exit "$rc" || next=$?
  if [[ "$next" != 0 && -n "${ZH_NEXT:-}" ]]; then
    scancel "$ZH_NEXT" && echo "chain: cancelled job $ZH_NEXT: nothing left for it to do"
  fi
}

# Run srun so that the batch shell can forward Slurm's warning signal to it (#SBATCH
# --signal=B:USR1@<s> reaches the batch shell only; srun passes USR1 on to every task, whose
# handler (zeropp_hier.app.longrun.deadline) makes all ranks save at the next step boundary).
zh_srun_forwarding_usr1() {
  if zh_render; then
    zh_run "$@"
    return 0
  fi
  "$@" &
  local pid=$! rc
  trap 'echo "batch shell: Slurm warning signal USR1, forwarded to srun (pid '"$pid"')"; kill -USR1 '"$pid"' 2>/dev/null || true' USR1
  # a trapped signal interrupts wait: wait again until srun has ended, then take its status (bash
  # keeps the status of a background job it already waited for)
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid" || true
  done
  rc=0
  wait "$pid" || rc=$?
  trap - USR1
  return "$rc"
}
