#!/usr/bin/env bash
# Wheels of the packages the lent GPU machine lacks, for its Python (3.12, x86-64), into .whl/
# (kept out of git), for scripts/gpu/check.sh to install there. That machine reaches no package
# registry; its image holds torch, transformers, tokenizers, numpy, tensorboard and pytest, not
# DeepSpeed, Hydra or pydantic; typing_extensions goes too (pydantic needs a recent one). The
# versions are the ones installed here, so the GPU runs what the CPU suite ran. Run from the
# repository root, where pip reaches a registry:
#     bash scripts/gpu/wheels.sh [python-version]      # default 3.12
set -euo pipefail
cd "$(dirname "$0")/../.."
PYV=${1:-3.12}
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")" .whl
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
rm -f .whl/*.whl
ver() { python3 -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
# published as wheels: fetched for the GPU machine's Python and platform
binary=(hydra-core omegaconf pydantic pydantic_core annotated-types typing-inspection typing_extensions hjson)
# published as source only (DeepSpeed, ANTLR's runtime): built here; pure Python, so any Python 3
# takes them (DS_BUILD_OPS=0: DeepSpeed's ops compile on first use on the GPU machine, as usual)
source=(deepspeed antlr4-python3-runtime)
pins() { for p in "$@"; do echo "$p==$(ver "$p")"; done; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl $(pins "${binary[@]}")
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl $(pins "${source[@]}")
ls -l .whl
echo "carry .whl in the device call; scripts/gpu/check.sh installs them to /tmp/site"
