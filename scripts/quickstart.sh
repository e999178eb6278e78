#!/usr/bin/env bash
# First command of the README: install, then train the small GPT on a simulated
# 2 nodes x 2 GPUs x 2 GCDs Frontier (8 CPU ranks, gloo) with the Hydra app. Extra arguments
# are Hydra overrides (e.g. preset=zeropp steps=50); metrics land in outputs/<date>/<time>/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python}" -m zeropp_hier train "$@"
