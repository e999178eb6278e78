#!/usr/bin/env bash
# Install zeropp-hier and what it needs into the current Python environment.
# - torch: an existing build (ROCm, CUDA or CPU) is kept; with none, torch 2.13.0 is installed
#   (on a machine without GPUs, point pip at PyTorch's CPU wheels to avoid a multi-GB CUDA build).
# - the package itself without build isolation, so its kernels are compiled against that torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[install] no torch found: installing torch==2.13.0"
  "$PY" -m pip install "torch==2.13.0"
else
  echo "[install] keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
fi
# Build tools first (the build runs without isolation, so they must be here already); the
# linters that .ci/run runs (ruff, mypy) beside them.
"$PY" -m pip install setuptools wheel ninja ruff mypy >/dev/null
# The package with its dependencies as pyproject.toml lists them (the one list), plus the test
# extra (pytest, hypothesis, the Hugging Face integration test) and the Frontier extra (the
# Hydra submitit launcher). With torch already present none of these installs another torch.
"$PY" -m pip install --no-build-isolation -e ".[test,frontier]" 2>&1 | tail -n 2
# torch is present, so the kernels must have been built: a silent fallback to the reference
# implementation would hide a broken build until the kernel tests (or a slow run) showed it.
"$PY" - <<'PYEOF'
import sys
import zeropp_hier, zeropp_hier.quant as q
from zeropp_hier.quant import _ext
st = _ext.status()
print("[install] zeropp_hier", zeropp_hier.__version__, "| quant backend:", q.backend())
if not st.loaded:
    sys.exit(f"[install] the compiled kernels did not build or load ({st.reason}); "
             "rerun `pip install --no-build-isolation -e . -v` and read the compiler output")
PYEOF
