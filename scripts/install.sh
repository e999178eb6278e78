#!/usr/bin/env bash
# Install zeropp-hier and what it needs into the current Python environment (PYTHON=... picks it).
# - torch: an existing build (ROCm, CUDA or CPU) is kept. With none:
#   * on a ROCm GPU node (ROCM_PATH set or /opt/rocm present, and `rocminfo` listing gfx agents),
#     or on any Frontier node (a login node, loginNN.frontier.olcf.ornl.gov per OLCF's user guide,
#     has no GPU agent but its torch must be the ROCm one), it stops and says how to install a ROCm
#     torch: a torch from PyPI is a CUDA build, and Frontier has its own script
#     (scripts/frontier/install.sh, OLCF's recipe);
#   * elsewhere it installs torch 2.13.0 from PyTorch's CPU wheel index, never a CUDA build. A
#     machine with only Debian's hipcc (no rocminfo agents) is not a ROCm GPU node.
# - the package itself without build isolation, so its kernels are compiled against that torch.
# RENDER_ONLY=1 prints the install commands instead of running them (the checks still run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TORCH_VERSION=2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu

# run CMD...: run it, or print it shell-quoted under RENDER_ONLY=1; QUIET=N keeps N last lines
run() {
  if [[ "${RENDER_ONLY:-0}" == "1" ]]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  elif [[ -n "${QUIET:-}" ]]; then
    "$@" 2>&1 | tail -n "$QUIET"
  else
    "$@"
  fi
}

# A ROCm GPU node: the ROCm stack is there and its runtime sees a GPU agent (gfxNNN).
rocm_gpu_agents() {
  [[ -n "${ROCM_PATH:-}" || -d /opt/rocm ]] || return 1
  local exe
  exe=$(command -v rocminfo || true)
  [[ -z "$exe" && -n "${ROCM_PATH:-}" && -x "$ROCM_PATH/bin/rocminfo" ]] && exe="$ROCM_PATH/bin/rocminfo"
  [[ -n "$exe" ]] || return 1
  "$exe" 2>/dev/null | sed -n 's/^[[:space:]]*Name:[[:space:]]*\(gfx[0-9a-f]*\).*/\1/p' | sort -u | tr '\n' ' '
}

frontier_host() {
  local h
  h=$(hostname -f 2>/dev/null || hostname 2>/dev/null || true)
  [[ "$h" == *.frontier.olcf.ornl.gov || "$h" =~ ^frontier[0-9]+ ]]
}

if ! "$PY" -c "import torch" 2>/dev/null; then
  agents=$(rocm_gpu_agents || true)
  where=""
  if [[ -n "${agents// /}" ]]; then
    where="a ROCm GPU node (rocminfo lists: ${agents% })"
  elif frontier_host; then
    where="a Frontier node ($(hostname -f 2>/dev/null || hostname))"
  fi
  if [[ -n "$where" ]]; then
    cat >&2 <<EOF
[install] no torch in $PY, and this is $where.
[install] Not installing torch here: PyPI's torch is a CUDA build. Install a ROCm build first:
  - on Frontier: bash scripts/frontier/install.sh  (OLCF's modules and ROCm wheel index; it
    also builds this package's HIP kernels for gfx90a)
  - elsewhere: pip install torch --index-url https://download.pytorch.org/whl/rocmX.Y
    with X.Y matching your ROCm (see https://pytorch.org/get-started/locally/), then rerun
    bash scripts/install.sh
EOF
    exit 2
  fi
  echo "[install] no torch found: installing torch==$TORCH_VERSION from PyTorch's CPU index"
  run "$PY" -m pip install "torch==$TORCH_VERSION" --index-url "$CPU_INDEX"
else
  KEPT_TORCH=$("$PY" -c 'import torch; print(torch.__version__)')
  echo "[install] keeping torch $KEPT_TORCH"
fi
# Build tools first (the build runs without isolation, so they must be here already); the
# linters that .ci/run runs (ruff, mypy) beside them.
QUIET=1 run "$PY" -m pip install setuptools wheel ninja ruff mypy
# The package with its dependencies as pyproject.toml lists them (the one list), plus the test
# extra (pytest, hypothesis, the Hugging Face integration test) and the Frontier extra (the
# Hydra submitit launcher). pyproject.toml declares the tested torch (2.13.0): a kept torch of
# another version stays, with the other requirements installed without torch and the package with
# --no-deps (pip resolving the pin would replace it, from PyPI with a CUDA build); the package
# then warns at import that this torch is untested ([Note: the torch versions claimed]).
if [[ -z "${KEPT_TORCH:-}" || "${KEPT_TORCH%%+*}" == "$TORCH_VERSION" ]]; then
  QUIET=2 run "$PY" -m pip install --no-build-isolation -e ".[test,frontier]"
else
  mapfile -t REQUIREMENTS < <("$PY" scripts/requirements.py --without torch test frontier)
  QUIET=2 run "$PY" -m pip install "${REQUIREMENTS[@]}"
  QUIET=2 run "$PY" -m pip install --no-deps --no-build-isolation -e ".[test,frontier]"
fi
[[ "${RENDER_ONLY:-0}" == "1" ]] && exit 0
# Before anything imports NumPy or torch: a CPU below the floor the installed wheels set gets one
# line naming the dependency and what the CPU offers, not a SIGILL; on a CPU above it, the floor
# each dependency declares is printed (zeropp_hier/detect/cpu_floor.py, a standard-library script).
"$PY" zeropp_hier/detect/cpu_floor.py || exit 2
# torch is present, so the kernels must have been built here, at install: the installed library is
# checked, not the first-use build (zeropp_hier/quant/_jit.py) that status() would fall back to.
"$PY" - <<'PYEOF'
import sys
import zeropp_hier, zeropp_hier.quant as q
from zeropp_hier.quant import _ext
st = _ext.load(_ext.EXT_MODULE)
if not st.loaded:
    sys.exit(f"[install] the compiled kernels did not build or load ({st.reason}); "
             "rerun `pip install --no-build-isolation -e . -v` and read the compiler output")
print("[install] zeropp_hier", zeropp_hier.__version__, "| quant backend:", q.backend())
PYEOF
