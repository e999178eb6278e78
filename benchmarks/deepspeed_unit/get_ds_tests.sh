#!/usr/bin/env bash
# Extract DeepSpeed's tests/ folder (outside this repository) for benchmarks/deepspeed_unit/run.py.
#
#   benchmarks/deepspeed_unit/get_ds_tests.sh [DEST=/tmp/ds_src] [REF]
#
# DS_GIT_DIR: a DeepSpeed git directory (bare mirror or clone) to read from; without it the
# repository is cloned (blobless) from GitHub into DEST.git. REF defaults to the tag of the
# installed DeepSpeed (v<version>); if that tag is missing, pass the closest commit as REF.
# The run of the README used master edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (2026-08-22,
# version.txt 0.19.6): the mirror had no v0.19.8 tag and the 0.19.8 sdist ships no tests.
set -euo pipefail
DEST=${1:-/tmp/ds_src}
VERSION=$(python -c 'import importlib.metadata as m; print(m.version("deepspeed"))')
REF=${2:-v$VERSION}
GIT_DIR=${DS_GIT_DIR:-}
if [ -z "$GIT_DIR" ]; then
  GIT_DIR="$DEST.git"
  [ -d "$GIT_DIR" ] || git clone --bare --filter=blob:none https://github.com/deepspeedai/DeepSpeed "$GIT_DIR"
fi
if ! git --git-dir="$GIT_DIR" rev-parse --verify -q "$REF^{commit}" >/dev/null; then
  echo "no $REF in $GIT_DIR; tags: $(git --git-dir="$GIT_DIR" tag -l 'v0.19*' | tr '\n' ' ')" >&2
  echo "pass the commit to use as the second argument" >&2
  exit 1
fi
rm -rf "$DEST/tests"
mkdir -p "$DEST"
git --git-dir="$GIT_DIR" archive "$REF" tests | tar -x -C "$DEST"
echo "deepspeedai/DeepSpeed $REF $(git --git-dir="$GIT_DIR" rev-parse "$REF^{commit}") (installed deepspeed $VERSION)" > "$DEST/SOURCE"
echo "DeepSpeed tests at $DEST/tests ($(cat "$DEST/SOURCE"))"
