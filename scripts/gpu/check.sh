#!/usr/bin/env bash
# The GPU checks, in one command per device call (device time is scarce): build the kernels for the
# GPU, then the steps named. Run from the repository root on a machine with a CUDA GPU and a CUDA
# torch (the lent machine: see docs/benchmarks.md "On a GPU"):
#     OUT=/tmp/gpu_out bash scripts/gpu/check.sh STEP...
# Steps, with their wall time on one H100 (estimates where a step has not run there yet):
#   probe    the link probe's timing on NCCL, with and without the synchronisation  (~1 min)
#   layer    one 20B layer's compression kernels beside its compute                   (~1 min)
#   tickwork the tick mode's local work per tick (host vs device), 20B layer, two chunk counts (~2 min)
#   profile  ncu on the fused requantize                                               (~1 min)
#   job1     the main job at world size 1, ours beside stock DeepSpeed ZeRO-3          (~3 min)
#   modes    the issue modes on 8 ranks sharing the GPU                                (~2 min)
#   tests    the gpu test lane (kernels, the engine beside stock, probe, serial lane)  (~1.5 min)
#   dryrun   the dry run with its engine on the GPU: device memory of rank 0 at 48 and 9,408 nodes,
#            presets and the 20B recipe, beside the planner's table                     (~4 min, estimate)
#   kernels  the kernel bandwidth benchmark; engine: the engine benchmark; job: the job on one
#            rank (NCCL) and on 8 (gloo)                                               (~1 min each)
# With no step named: probe layer tickwork profile job1 modes tests (too long for one call of the
# lent machine: split it in two, e.g. "probe layer tickwork profile job1" and "modes tests").
# Missing Python packages are installed from wheels in .whl/ (scripts/gpu/wheels.sh makes them).
# Everything kept lands in $OUT as at most 8 files (what the device tool brings back).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(probe layer tickwork profile job1 modes tests)
LOG="$OUT/log_$(IFS=_; echo "${steps[*]}").txt"
want() { for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
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
have_gpu_kernels() { "$PY" -c 'from zeropp_hier import quant; import sys; sys.exit(quant.backend("cuda") != "cuda")' 2>/dev/null; }
if have_gpu_kernels; then
  echo "the GPU kernels are built already (a second call on a warm machine)"
else
  t0=$(date +%s)
  TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=16 "$PY" setup.py build_ext --inplace >/tmp/build_full.log 2>&1 \
    && tail -n 3 /tmp/build_full.log || { tail -n 60 /tmp/build_full.log; echo "BUILD FAILED"; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
"$PY" -c 'from zeropp_hier import quant; from zeropp_hier.quant import _ext; print("extension:", _ext.status(), "| backend(cuda):", quant.backend("cuda"))'

if want probe; then
  section "probe timing on NCCL, with the synchronisation (all pass)"
  timeout 300 "$PY" -m pytest tests/gpu/test_probe_timing.py -v -rA -p no:cacheprovider 2>&1 | tail -n 40
  section "probe timing without the synchronisation (the two agreement tests are expected to FAIL)"
  ZEROPP_HIER_TEST_DROP_SYNC=1 timeout 300 "$PY" -m pytest tests/gpu/test_probe_timing.py -v -rA -p no:cacheprovider -k agrees 2>&1 | tail -n 40
fi
if want layer; then
  section "benchmarks.gpu.layer_cost: one 20B layer's compression kernels beside its compute"
  timeout 240 "$PY" -m benchmarks.gpu.layer_cost --out "$OUT/gpu_layer_cost.json" 2>&1 | tail -n 80
fi
if want tickwork; then
  section "benchmarks.gpu.tick_work: the tick mode's local work per tick, host beside device, one 20B layer"
  # at the tick mode's default chunk count, then at the one zeropp-hier plan chooses
  timeout 240 "$PY" -m benchmarks.gpu.tick_work --out "$OUT/gpu_tick_work.json" 2>&1 | tail -n 20
  timeout 240 "$PY" -m benchmarks.gpu.tick_work --chunks plan --out "$OUT/gpu_tick_work_plan.json" 2>&1 | tail -n 20
fi
if want profile; then
  section "ncu: the fused requantize at the gcd stage's chunk (what bounds it)"
  timeout 300 ncu --kernel-name-base demangled --kernel-name regex:PartsSumSource \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,dram__bytes.sum \
    "$PY" -m benchmarks.gpu.layer_cost --profile --out /tmp/layer_profile.json >"$OUT/ncu_fused.txt" 2>&1
  grep -E "PartsSumSource|Throughput|Occupancy|Registers Per|Duration|Stall|pipe_xu|inst_executed|dram__bytes|Issued Warp" "$OUT/ncu_fused.txt" | head -n 80
fi
if want job1; then
  section "benchmarks.gpu.job: the job at world size 1, our exact ZeRO-3 beside stock"
  timeout 560 "$PY" -m benchmarks.gpu.job --out "$OUT/gpu_job.json" --work /tmp/gpu_job_runs 2>&1 | tail -n 40
fi
if want modes; then
  section "benchmarks.gpu.modes: the issue modes on 8 ranks sharing the GPU"
  # the ticks rows hold the package's refusal (gloo sends point-to-point from host memory only)
  timeout 300 "$PY" -m benchmarks.gpu.modes --out "$OUT/gpu_modes.json" 2>&1 | grep -v "^\[W" | tail -n 40
fi
if want tests; then
  section "gloo collectives on CUDA tensors"
  timeout 300 "$PY" scripts/gpu/gloo_cuda_probe.py
  section "pytest tests/gpu"
  ran_probe=(); want probe && ran_probe=(--ignore=tests/gpu/test_probe_timing.py)  # its log is above
  timeout 420 "$PY" -m pytest tests/gpu -q -p no:cacheprovider -rs "${ran_probe[@]}" 2>&1 | tail -n 40
fi
if want dryrun; then
  section "benchmarks.gpu.dryrun: rank 0 at 48 and 9,408 nodes with its engine on the GPU (device memory)"
  timeout 480 "$PY" -m benchmarks.gpu.dryrun --runs ${DRYRUN_RUNS:-presets neox20b_4 neox20b} --jobs "${DRYRUN_JOBS:-6}" --timeout "${DRYRUN_TIMEOUT:-300}" \
    --out "$OUT/gpu_dryrun.json" 2>&1 | grep -v "^\[W" | tail -n 40
fi
if want kernels; then
  section "benchmarks.gpu.kernels"
  timeout 600 "$PY" -m benchmarks.gpu.kernels --out "$OUT/gpu_kernels.json"
fi
if want engine; then
  section "benchmarks.gpu.engine"
  timeout 900 "$PY" -m benchmarks.gpu.engine --out "$OUT/gpu_engine.json" 2>&1 | grep -v "^\[W" | tail -n 150
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
