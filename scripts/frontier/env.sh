# Frontier environment for zeropp-hier (source it; sourced by train.sbatch).
#
#   source scripts/frontier/env.sh            # in a job or on a login node
#
# Follows OLCF's "PyTorch on Frontier" guide
# (https://docs.olcf.ornl.gov/software/analytics/pytorch_frontier.html, checked 2026-11): its
# modules, OLCF's rccl-net-plugin module for RCCL over Slingshot (instead of a hand-built
# aws-ofi-rccl), the RCCL/libfabric variables it lists as "strongly recommended by HPE and AMD on
# Frontier for both correctness and best performance at scale", MIOpen's caches on node-local
# /tmp. Versions are variables: set them to the guide of the day (`module avail rocm`).
# ZH_RCCL_PLUGIN=<dir>/lib/librccl-net.so uses a plugin you built instead of the module.

: "${ZH_PRGENV_MODULE:=PrgEnv-gnu/8.7.0}"
: "${ZH_CPE_MODULE:=cpe/26.03}"
: "${ZH_ROCM_MODULE:=rocm/7.1.1}"
: "${ZH_RCCL_PLUGIN:=}"

_zh_module() {
  if [[ "${RENDER_ONLY:-0}" == "1" ]]; then
    echo "+ module $*"
  else
    module "$@" || { echo "error: module $* failed" >&2; return 1; }
  fi
}

_zh_module load "$ZH_PRGENV_MODULE"
_zh_module load "$ZH_CPE_MODULE"
_zh_module load "$ZH_ROCM_MODULE"
if [[ -z "$ZH_RCCL_PLUGIN" ]]; then
  _zh_module load rccl-net-plugin      # OLCF: load after rocm; sets NCCL_NET_PLUGIN for RCCL
else
  if [[ "${RENDER_ONLY:-0}" != "1" && ! -e "$ZH_RCCL_PLUGIN" ]]; then
    echo "error: ZH_RCCL_PLUGIN=$ZH_RCCL_PLUGIN does not exist (lib/librccl-net.so of your build)" >&2
    return 1 2>/dev/null || exit 1
  fi
  export NCCL_NET_PLUGIN="$ZH_RCCL_PLUGIN"  # OLCF: without it the plugin is not used
fi
_zh_module load craype-accel-amd-gfx90a
if [[ -n "${CRAY_LD_LIBRARY_PATH:-}" ]]; then  # OLCF: needed with a non-default CPE
  export LD_LIBRARY_PATH="$CRAY_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# Use the plugin or refuse to start: without NCCL_NET, RCCL that cannot load the plugin falls back
# to TCP sockets silently (many times slower); with it, the job stops, and zeropp-hier names the
# module before any rank waits ([Note: the network plugin] in zeropp_hier/detect/net_plugin.py).
export NCCL_NET="AWS Libfabric"               # the libfabric plugin's network name
# RCCL on Frontier (OLCF's list, each for correctness or performance at scale):
export NCCL_CROSS_NIC=1                        # rings may leave a node on one NIC and enter on another
export NCCL_NET_GDR_LEVEL=PHB                  # GPU-direct RDMA between GCD memory and the NICs
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3  # bootstrap on the Slingshot NICs (OLCF: try hsn0 alone on hangs)
# libfabric (cxi provider) under the plugin:
export HSA_FORCE_FINE_GRAIN_PCIE=1             # OLCF's list: fine-grained PCIe host memory for the plugin
export FI_MR_CACHE_MONITOR=kdreg2              # OLCF: kdreg2 or userfaultfd; memhooks deadlocks the plugin
export FI_CXI_DISABLE_HOST_REGISTER=1          # OLCF's list (HPE/AMD): no cxi host-memory registration
export FI_CXI_DEFAULT_CQ_SIZE=131072           # completion queue large enough at scale
export FI_CXI_RDZV_PROTO=alt_read              # alternative rendezvous: needs #SBATCH --network=disable_rdzv_get
export FI_CXI_RDZV_EAGER_SIZE=0                # with alt_read: rendezvous settings OLCF lists
export FI_CXI_RDZV_THRESHOLD=0
export FI_CXI_RDZV_GET_MIN=0
export FI_CXI_DEFAULT_TX_SIZE=2048             # transmit queue depth OLCF lists
export FI_CXI_RX_MATCH_MODE=hybrid             # hardware matching, software when it overflows

# MIOpen: per-job caches on node-local storage (OLCF: bypasses MIOpen's disk I/O errors)
export MIOPEN_USER_DB_PATH="/tmp/miopen-${USER:-user}-${SLURM_JOB_ID:-interactive}"
export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"

export OMP_NUM_THREADS=7             # the 7 cores each task gets (-c7)
