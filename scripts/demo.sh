#!/usr/bin/env bash
# Quick start: set up, then run the main job on the embedded default (SQLite posbias.db, a local Ray,
# vLLM on CPU, SmolLM2-135M-Instruct), print its position curve and write demo-curve.png.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate

# MMLU comes from the Hugging Face hub (cais/mmlu) when it is reachable; otherwise from a local copy named
# by POSBIAS_MMLU_DIR. Default to the copy beside this checkout when there is one.
if [ -z "${POSBIAS_MMLU_DIR:-}" ] && [ -d ../shared/data/mmlu ]; then
    export POSBIAS_MMLU_DIR="$(cd ../shared/data/mmlu && pwd)"
fi

posbias db upgrade
posbias run --model demo --batch-sizes 1,5,10 --iterations 16 --answer-mode constrained \
    --plot demo-curve.png "$@"
