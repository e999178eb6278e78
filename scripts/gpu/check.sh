#!/usr/bin/env bash
# The GPU checks, in one command (device time is scarce): build the kernels for the GPU, run the
# gpu test lane, the kernel benchmark, the engine on CUDA tensors beside stock DeepSpeed, and a
# one-rank run of the main job on NCCL. Run from the repository root on a machine with a CUDA GPU
# and a CUDA torch:
#     OUT=/tmp/gpu_out bash scripts/gpu/check.sh [tests] [kernels] [profile] [engine] [job] [all]
# Missing Python packages may be supplied as wheels in .whl/ (installed to /tmp/site).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
LOG="$OUT/log.txt"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(all)
want() { for s in "${steps[@]}"; do [ "$s" = all ] || [ "$s" = "$1" ] && return 0; done; return 1; }
section() { echo; echo "===== $* ($(date +%T))"; }
{
section environment
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, "|", torch.cuda.get_device_name(0))'
nvcc --version | tail -n 2
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import deepspeed, hydra; print("deepspeed", deepspeed.__version__, "| hydra", hydra.__version__)'

section build
t0=$(date +%s)
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=16 "$PY" setup.py build_ext --inplace >"$OUT/build_full.log" 2>&1 \
  && { tail -n 3 "$OUT/build_full.log"; rm -f "$OUT/build_full.log"; } \
  || { tail -n 60 "$OUT/build_full.log"; echo "BUILD FAILED"; }
echo "built in $(( $(date +%s) - t0 )) s"
"$PY" -c 'from zeropp_hier import quant; from zeropp_hier.quant import _ext; print("extension:", _ext.status(), "| backend(cuda):", quant.backend("cuda"))'

if want tests; then
  section "gloo collectives on CUDA tensors"
  timeout 300 "$PY" scripts/gpu/gloo_cuda_probe.py
  section "pytest tests/gpu"
  timeout 900 "$PY" -m pytest tests/gpu -q -p no:cacheprovider -x -rs 2>&1 | tail -n 40
fi
if want kernels; then
  section "benchmarks.kernels_gpu"
  timeout 600 "$PY" -m benchmarks.kernels_gpu --out "$OUT/gpu_kernels.json"
fi
if want profile; then
  section "ncu: the fused requantize and the bf16 quantize at 64M elements"
  cat >/tmp/prof.py <<'PYEOF'
import torch
from zeropp_hier import quant
n = 64 << 20
x = torch.randn(n, device="cuda")
for bits in (8, 4):
    q = quant.quantize(x, bits, 256)
    st = quant.Quantized(q.data.unsqueeze(0).repeat(4, 1), q.scales.unsqueeze(0).repeat(4, 1), n, bits, 256)
    quant.dequantize_sum_requantize(st, bits, 256)
quant.quantize(x.bfloat16(), 8, 256)
torch.cuda.synchronize()
PYEOF
  timeout 300 ncu --kernel-name regex:quantize_blocks --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis "$PY" /tmp/prof.py 2>&1 | grep -E "quantize_blocks|Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Duration|Block Limit Reg|Mem Busy|Max Bandwidth" | head -n 60
fi
if want engine; then
  section "benchmarks.gpu_engine"
  timeout 900 "$PY" -m benchmarks.gpu_engine --out "$OUT/gpu_engine.json" 2>&1 | grep -v "^\[W" | tail -n 150
fi
if want job; then
  section "main job, one rank, NCCL"
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 timeout 600 "$PY" -m zeropp_hier train \
    steps=8 dtype=bf16 progress=off topology.section.gpus_per_node=1 topology.section.gcds_per_gpu=1 \
    hydra.run.dir="$OUT/job" 2>&1 | tail -n 60
  cp "$OUT/job/summary.json" "$OUT/job1_summary.json" 2>/dev/null
  rm -rf "$OUT/job"
  section "main job, 8 local ranks sharing the GPU, gloo"
  timeout 600 "$PY" -m zeropp_hier train steps=8 dtype=bf16 progress=off hydra.run.dir="$OUT/job" 2>&1 | tail -n 45
  cp "$OUT/job/summary.json" "$OUT/job8_summary.json" 2>/dev/null
  rm -rf "$OUT/job"
fi
section done
} 2>&1 | tee "$LOG"
