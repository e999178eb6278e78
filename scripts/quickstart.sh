#!/usr/bin/env bash
# First command of the README: install, tokenize a small real corpus that ships with Python (the
# standard library's sources, byte level) once into data/stdlib/, then train the tiny GPT-NeoX on
# it on a simulated 2 nodes x 2 GPUs x 2 GCDs Frontier (8 CPU ranks, gloo) with the Hydra app.
# Extra arguments are Hydra overrides (e.g. preset=zeropp steps=50 activation_checkpointing=torch);
# metrics land in outputs/<date>/<time>/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY="${PYTHON:-python}"
[ -f data/stdlib/index.json ] || "$PY" -m zeropp_hier data prepare --stdlib --out data/stdlib
exec "$PY" -m zeropp_hier train data=tokens data.path="$PWD/data/stdlib" "$@"
