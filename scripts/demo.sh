#!/usr/bin/env bash
# Quick start: set up, then run the main job on the embedded default (SQLite posbias.db, a local Ray,
# vLLM on CPU, SmolLM2-135M-Instruct), print its position curve and write demo-curve.png.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate

# MMLU from the copy beside this checkout when nothing names one, saved in .env so that the commands you run
# here after the demo read it too.
scripts/demo_settings.sh

posbias db upgrade
posbias run --model demo --batch-sizes 1,5,10 --iterations 16 --answer-mode constrained \
    --plot demo-curve.png "$@"
echo "demo: done; \`. .venv/bin/activate\` puts posbias on this shell's PATH for the README's next commands"
