# Frontier environment for zeropp-hier (source it; sourced by train.sbatch).
#
#   source scripts/frontier/env.sh            # in a job or on a login node
#
# Follows OLCF's guidance for PyTorch on Frontier: ROCm + the GNU programming environment,
# RCCL over Slingshot through the aws-ofi-rccl (libfabric) plugin, sockets on the high-speed
# interface hsn0, MIOpen's caches on node-local /tmp (its default, in $HOME, is a shared
# SQLite file that many ranks corrupt or lock). Versions are variables: override them to match
# the modules of the day (`module avail rocm`).
#
# Needs: AWS_OFI_RCCL_DIR = an aws-ofi-rccl build matching the ROCm module (its lib/ holds
# librccl-net.so; OLCF documents how to build it); set it before sourcing.

: "${ZH_ROCM_MODULE:=rocm/6.2.4}"
: "${ZH_PRGENV_MODULE:=PrgEnv-gnu}"
: "${AWS_OFI_RCCL_DIR:=}"

_zh_module() {
  if [[ "${RENDER_ONLY:-0}" == "1" ]]; then
    echo "+ module $*"
  else
    module "$@" || { echo "error: module $* failed" >&2; return 1; }
  fi
}

_zh_module load "$ZH_PRGENV_MODULE"
_zh_module load "$ZH_ROCM_MODULE"
_zh_module load craype-accel-amd-gfx90a

if [[ "${RENDER_ONLY:-0}" == "1" && -z "$AWS_OFI_RCCL_DIR" ]]; then
  AWS_OFI_RCCL_DIR='<AWS_OFI_RCCL_DIR>'   # rendering: show where the plugin goes
elif [[ "${RENDER_ONLY:-0}" != "1" && ! -e "$AWS_OFI_RCCL_DIR/lib/librccl-net.so" ]]; then
  echo "error: no aws-ofi-rccl plugin at AWS_OFI_RCCL_DIR=$AWS_OFI_RCCL_DIR (lib/librccl-net.so);" \
       "build it for $ZH_ROCM_MODULE and set AWS_OFI_RCCL_DIR" >&2
  return 1 2>/dev/null || exit 1
fi
export LD_LIBRARY_PATH="$AWS_OFI_RCCL_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# RCCL over Slingshot (libfabric cxi provider via the plugin); sockets only on hsn0
export NCCL_SOCKET_IFNAME=hsn0
export NCCL_NET_GDR_LEVEL=3          # GPU-direct RDMA between GCD memory and the NICs
export NCCL_CROSS_NIC=1
export FI_CXI_ATS=0
export FI_MR_CACHE_MONITOR=userfaultfd
export FI_CXI_DISABLE_CQ_HUGETLB=1

# MIOpen: per-job caches on node-local storage
export MIOPEN_USER_DB_PATH="/tmp/miopen-${USER:-user}-${SLURM_JOB_ID:-interactive}"
export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"

export OMP_NUM_THREADS=7             # the 7 cores each task gets (-c7)
