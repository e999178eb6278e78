#!/usr/bin/env bash
# Compile checks for the GPU kernels, run in CI and by tests/system/test_kernel_compile.py.
#
#   hip_kernels/check_compile.sh [SOURCE]     (default SOURCE: hip_kernels/quant_kernels.hip)
#
# 1. hipcc (AMD platform) for gfx90a, the MI250X GCD. The host object embeds an offload bundle
#    in its .hip_fatbin section; we list the bundle's targets with clang-offload-bundler, unbundle
#    the gfx90a code object and check it is an AMDGPU ELF for gfx90a that defines kernels.
# 2. nvcc for sm_80 with the same source (gpu_runtime.h maps the HIP names to CUDA). With -keep
#    nvcc leaves the sm_80 cubin; we check it is a CUDA ELF for sm_80 that defines kernels, and
#    that the object carries a fatbin.
# Exits non-zero on a compile error or when a check fails. Installs Debian's hipcc with apt-get
# when it is missing and we are root. No GPU is needed (hipcc may print a traceback from
# rocm_agent_enumerator when none exists; that is harmless).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(realpath "${1:-$here/quant_kernels.hip}")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fail() { echo "check_compile: FAIL: $*" >&2; exit 1; }
# grep -q on a captured text, not on a pipe: with pipefail, grep -q quitting early would kill
# the writer with SIGPIPE and fail the pipeline.
has() { grep -q -e "$1" <<<"$2"; }
step() { echo "check_compile: $*"; }

# Same floating-point flags as hip_kernels/build.py ([Note: bit-exact arithmetic]).
HIP_FLAGS=(-std=c++17 -O3 -ffp-contract=off -fno-gpu-flush-denormals-to-zero
           -fhip-fp32-correctly-rounded-divide-sqrt -I"$here")
NVCC_FLAGS=(-std=c++17 -O3 --fmad=false --ftz=false --prec-div=true --prec-sqrt=true -I"$here")

# ---- tools -----------------------------------------------------------------------------------
if ! command -v hipcc >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "hipcc missing: apt-get install hipcc"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hipcc >/dev/null
  fi
  command -v hipcc >/dev/null 2>&1 || fail "hipcc not found (Debian: apt-get install hipcc)"
fi
command -v nvcc >/dev/null 2>&1 || fail "nvcc not found (CUDA toolkit; add its bin/ to PATH)"

# LLVM tools of the clang that hipcc drives (Debian: /usr/lib/llvm-N/bin), newest first.
llvm_tool() {
  local t
  for t in $(ls -d /usr/lib/llvm-*/bin/"$1" 2>/dev/null | sort -V -r) "$(command -v "$1" || true)"; do
    [ -x "$t" ] && { echo "$t"; return 0; }
  done
  fail "$1 not found (Debian: it comes with clang/llvm, a dependency of hipcc)"
}
BUNDLER="$(llvm_tool clang-offload-bundler)"
READELF="$(llvm_tool llvm-readelf)"

# ---- 1. HIP for gfx90a -----------------------------------------------------------------------
step "hipcc --offload-arch=gfx90a -c $src"
if ! HIP_PLATFORM=amd hipcc --offload-arch=gfx90a "${HIP_FLAGS[@]}" -c "$src" \
    -o "$work/kernels_hip.o" >"$work/hipcc.log" 2>&1; then
  grep -v -e rocm_agent_enumerator -e '^Traceback' -e '^  ' "$work/hipcc.log" >&2 || true
  fail "hipcc could not compile $src for gfx90a"
fi
objcopy --dump-section .hip_fatbin="$work/fatbin.bin" "$work/kernels_hip.o" /dev/null \
  || fail "no .hip_fatbin section in the hipcc object (no device code)"
targets="$("$BUNDLER" --list --type=o --input="$work/fatbin.bin")"
echo "$targets" | sed 's/^/  bundle target: /'
target="$(grep -m1 -E '^hip.*-amdgcn-amd-amdhsa-.*gfx90a' <<<"$targets" || true)"
[ -n "$target" ] || fail "the offload bundle has no gfx90a target"
"$BUNDLER" --unbundle --type=o --input="$work/fatbin.bin" --targets="$target" \
  --output="$work/gfx90a.co"
header="$("$READELF" -h "$work/gfx90a.co")"
has 'EM_AMDGPU' "$header" || fail "the gfx90a code object is not an AMDGPU ELF"
# e_flags & 0xff is EF_AMDGPU_MACH; 0x3f is gfx90a.
flags="$(echo "$header" | awk '/Flags:/ {print $2}')"
[ $((flags & 0xff)) -eq $((0x3f)) ] || fail "code object e_flags $flags is not gfx90a (0x3f)"
has 'amdgcn-amd-amdhsa--gfx90a' "$("$READELF" --notes "$work/gfx90a.co")" \
  || fail "code object metadata does not name gfx90a"
# each kernel has a <name>.kd descriptor symbol (listed in .symtab and .dynsym: count names)
nkernels="$("$READELF" -s -W "$work/gfx90a.co" | awk '$NF ~ /\.kd$/ {print $NF}' | sort -u | wc -l)"
[ "$nkernels" -gt 0 ] || fail "the gfx90a code object defines no kernels"
step "OK gfx90a: $nkernels kernels in $target"
step "gfx90a kernels: $("$READELF" -s -W "$work/gfx90a.co" | awk '$NF ~ /\.kd$/ {print $NF}' | sort -u | tr '\n' ' ')"

# ---- 2. CUDA for sm_80 -----------------------------------------------------------------------
step "nvcc -x cu -arch=sm_80 -c $src"
mkdir -p "$work/keep"
nvcc -x cu -arch=sm_80 "${NVCC_FLAGS[@]}" -keep -keep-dir "$work/keep" -c "$src" \
  -o "$work/kernels_cuda.o" || fail "nvcc could not compile $src for sm_80"
has '\.nv_fatbin' "$(readelf -S "$work/kernels_cuda.o")" || fail "no .nv_fatbin in the nvcc object"
cubins=("$work"/keep/*.sm_80.cubin)
cubin="${cubins[0]}"
[ -f "$cubin" ] || fail "nvcc produced no sm_80 cubin"
has 'NVIDIA CUDA' "$(readelf -h "$cubin" 2>/dev/null)" || fail "$cubin is not a CUDA ELF"
# The cubin's e_flags hold the SM number in bits 8..15 (CUDA 12+ ELF ABI) or 0..7 (older).
cflags="$(readelf -h "$cubin" 2>/dev/null | awk '/Flags:/ {print $2}')"
[ $(((cflags >> 8) & 0xff)) -eq 80 ] || [ $((cflags & 0xff)) -eq 80 ] \
  || fail "cubin e_flags $cflags do not say sm_80"
# every kernel gets its own .text.<mangled name> section
ncuda="$(readelf -S -W "$cubin" 2>/dev/null | grep -c ' \.text\.' || true)"
[ "$ncuda" -gt 0 ] || fail "the sm_80 cubin defines no kernels"
step "OK sm_80: $ncuda kernels"
step "sm_80 kernels: $(readelf -S -W "$cubin" 2>/dev/null | grep -o ' \.text\.[^ ]*' | sort -u | tr -d ' ' | tr '\n' ' ')"
echo "check_compile: all checks passed"
