#!/usr/bin/env bash
# Install zeropp-hier on Frontier the way OLCF documents PyTorch there, into a conda environment
# that is then packed (conda-pack) for train.sbatch to broadcast to each node's NVMe (sbcast).
#
#   bash scripts/frontier/install.sh                 # on a login node, from the repository root
#   RENDER_ONLY=1 bash scripts/frontier/install.sh   # print the commands, run none
#
# Sources (checked 2026-11):
#   OLCF "PyTorch on Frontier", https://docs.olcf.ornl.gov/software/analytics/pytorch_frontier.html
#     (modules PrgEnv-gnu/8.7.0, cpe/26.03, miniforge3/23.11.0-0, rocm/7.1.1,
#     craype-accel-amd-gfx90a; LD_LIBRARY_PATH=$CRAY_LD_LIBRARY_PATH:... with a non-default CPE;
#     conda env with python=3.12; torch==2.10.0 from https://download.pytorch.org/whl/rocm7.1)
#   OLCF "Sbcast Conda Environments", https://docs.olcf.ornl.gov/software/python/sbcast_conda.html
#     (conda-pack from conda-forge; `conda pack --format tar.gz`; conda-unpack on the NVMe)
# Versions are variables: set them to the guide of the day.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/frontier/common.sh"

: "${ZH_PRGENV_MODULE:=PrgEnv-gnu/8.7.0}"
: "${ZH_CPE_MODULE:=cpe/26.03}"
: "${ZH_CONDA_MODULE:=miniforge3/23.11.0-0}"
: "${ZH_ROCM_MODULE:=rocm/7.1.1}"
: "${ZH_PYTHON_VERSION:=3.12}"
: "${ZH_TORCH_VERSION:=2.10.0}"
: "${ZH_TORCH_INDEX:=https://download.pytorch.org/whl/rocm7.1}"
: "${ZH_ENV_PREFIX:=${MEMBERWORK:-$HOME}/zeropp-hier-env}"        # the conda env (Lustre)
: "${ZH_ENV_TARBALL:=${MEMBERWORK:-$HOME}/zeropp-hier-env.tar.gz}" # what train.sbatch broadcasts
export PYTORCH_ROCM_ARCH=gfx90a  # MI250X GCDs: the HIP kernels are built for this target only

zh_module() {
  if zh_render; then echo "+ module $*"; else module "$@" || zh_die "module $* failed"; fi
}

zh_module load "$ZH_PRGENV_MODULE"
zh_module load "$ZH_CPE_MODULE"
zh_module load "$ZH_CONDA_MODULE"
zh_module load "$ZH_ROCM_MODULE"
zh_module load craype-accel-amd-gfx90a
if [[ -n "${CRAY_LD_LIBRARY_PATH:-}" ]]; then  # OLCF: needed with a non-default CPE
  export LD_LIBRARY_PATH="$CRAY_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

PY="$ZH_ENV_PREFIX/bin/python"
if zh_render || [[ ! -x "$PY" ]]; then
  zh_run conda create -y -p "$ZH_ENV_PREFIX" "python=$ZH_PYTHON_VERSION" conda-pack -c conda-forge
fi
# torch from the ROCm wheel index OLCF names (PyPI's torch is a CUDA build)
zh_run "$PY" -m pip install "torch==$ZH_TORCH_VERSION" --index-url "$ZH_TORCH_INDEX"
zh_run "$PY" -m pip install setuptools wheel ninja
# pyproject.toml declares the tested torch (2.13.0), not OLCF's: pip resolving it would replace this
# ROCm torch with PyPI's CUDA build. So the requirements go in without torch (the extra `frontier`
# brings the monitors the job can switch on: tensorboard, wandb), then the package with --no-deps;
# at import it warns that this torch is untested, naming it ([Note: the torch versions claimed]).
ZH_READER="$PY"; [[ -x "$PY" ]] || ZH_READER=python3  # rendered: the env may not exist yet
mapfile -t ZH_REQUIREMENTS < <("$ZH_READER" "$ROOT/scripts/requirements.py" --without torch frontier)
[[ ${#ZH_REQUIREMENTS[@]} -gt 0 ]] || zh_die "scripts/requirements.py listed no requirements"
zh_run "$PY" -m pip install "${ZH_REQUIREMENTS[@]}"
# Non-editable: the packed environment must hold the package itself, not a link to this checkout.
# No build isolation, so the HIP kernels build with hipcc against this torch for gfx90a.
zh_run env PYTORCH_ROCM_ARCH=gfx90a "$PY" -m pip install --no-deps --no-build-isolation "$ROOT[frontier]"
# The installed kernels must load (a login node has no GPU: loading the library is what is checked
# here); not the first-use build, which every node would then repeat at the job's start.
zh_run "$PY" -c "$(cat <<'PYEOF'
import sys, torch
from zeropp_hier.quant import _ext
st = _ext.load(_ext.EXT_MODULE)
print("[install] torch", torch.__version__, "hip", torch.version.hip, "| kernels loaded:", st.loaded)
if not torch.version.hip:
    sys.exit("[install] this torch is not a ROCm build; check ZH_TORCH_INDEX")
if not st.loaded:
    sys.exit(f"[install] the HIP kernels did not build or load ({st.reason})")
PYEOF
)"
zh_run "$ZH_ENV_PREFIX/bin/conda-pack" --format tar.gz --n-threads -1 --prefix "$ZH_ENV_PREFIX" \
  --output "$ZH_ENV_TARBALL" --force
echo "[install] packed $ZH_ENV_TARBALL; train.sbatch broadcasts it (ZH_ENV_TARBALL)"
