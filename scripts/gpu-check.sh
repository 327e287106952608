#!/usr/bin/env bash
# The GPU check: run it first on a new cluster, inside the posbias-gpu image on one GPU, with no network.
#
#     docker run --rm --gpus 1 --shm-size 8g -v "$PWD:/src:ro" --entrypoint bash posbias-gpu:0.1.0 \
#         /src/scripts/gpu-check.sh
#
# (on Kubernetes: `kubectl exec` into a GPU worker pod with a checkout copied in, and run it the same way).
# From a checkout, it builds the tiny random-weights Gemma 2 (head size 256, as the real model's: the size
# that decides its attention backend) and Gemma 3 (five sliding layers, then one global) with
# tests/support/tinymodels.py, and then, through the queue (SQLite in a scratch folder) and a local Ray:
#
#   - a constrained job on Gemma 2 with the variants baseline, global-only and window:32, and one on Gemma 3:
#     each done, each variant's layers read back from vLLM as it asked, and the attention backend named by
#     the workers (not guessed);
#   - a load that must fail (a config whose head size the weights do not have): the job fails, and its
#     error names the engine core's root cause, not vLLM's "See root cause above";
#   - the time for GPU memory to be free again after an engine is released.
#
# Then its hf part (scripts/gpu_check_hf.py), which needs only torch, transformers and posbias (no Ray, no
# vLLM): the hf engine in this process on CUDA with tiny Gemma 2 and Gemma 3, its option probabilities and
# attention masses against the CPU's (float32 within 1e-4, bfloat16 within 2e-2), its GPU memory handed back
# on close, and the answer-rows attention against transformers' eager attention at 8k and 32k tokens (time
# and peak memory). On a bare GPU machine run that part alone:
#
#     scripts/gpu-check.sh hf                   # --device cpu --tokens 1024,2048 ...: the tests run it so
#
# It prints its tables and exits non-zero when a check fails. `--dry-run` builds the models and prints the
# jobs it would run, without Ray or a GPU (the deploy tests run that on a CPU). It has not run on a GPU in
# the machines posbias is built on.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/posbias-gpu-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export POSBIAS_DATABASE_URL="sqlite:///$work/posbias.db"
export POSBIAS_CACHE_DIR="$work/cache"
export POSBIAS_COMPILE_CACHE_DIR="$work/compile"
export POSBIAS_RAY_ADDRESS=local
export POSBIAS_DEVICE="${POSBIAS_DEVICE:-gpu}"
export POSBIAS_PLACEMENT_TIMEOUT_SECONDS=300
export GPU_CHECK_REPO="$repo" GPU_CHECK_WORK="$work"

hf_only=0
if [[ "${1:-}" == hf ]]; then
    hf_only=1
    shift
fi
status=0

if (( hf_only == 0 )); then
python3 - "$@" <<'PYTHON' || status=$?
import json
import sys
import time
from os import environ
from pathlib import Path

sys.path.insert(0, str(Path(environ["GPU_CHECK_REPO"]) / "tests"))
from support.tinymodels import build_tiny_model  # noqa: E402

work = Path(environ["GPU_CHECK_WORK"])
dry_run = "--dry-run" in sys.argv[1:]
rows: list[tuple[str, str, str]] = []


def check(name: str, ok: bool, detail: str) -> None:
    rows.append((name, "ok" if ok else "FAIL", detail))


# Questions in MMLU's JSONL layout: no download.
data = work / "questions.jsonl"
with data.open("w") as out:
    for i in range(40):
        choices = [f"{i + k}" for k in range(4)]
        out.write(json.dumps({"question": f"Which is {i + i % 4}?", "subject": "arithmetic", "choices": choices,
                              "answer": i % 4}) + "\n")
environ["POSBIAS_MMLU_DIR"] = str(work)

gemma2 = build_tiny_model(work / "gemma2", architecture="gemma2", head_dim=256, sliding_window=64)
gemma3 = build_tiny_model(work / "gemma3", architecture="gemma3", num_layers=6, sliding_window=48)
broken = build_tiny_model(work / "broken", architecture="llama", num_layers=1)
config = json.loads((broken / "config.json").read_text())
config["head_dim"] = 36  # 2 heads x 36 rows of a weight that has 64: the load must fail
(broken / "config.json").write_text(json.dumps(config))


def spec(model: Path, **fields: object) -> dict[str, object]:
    return {"model": str(model), "batch_sizes": [2, 8], "iterations": 2, "answer_mode": "constrained",
            "dataset": {"path": str(data)}, "engine": {"gpu_memory_utilization": 0.5}, **fields}


jobs = {
    "gemma2 (head size 256), 3 variants": spec(gemma2, variants=["baseline", "global-only", "window:32"]),
    "gemma3": spec(gemma3),
    "a load that must fail": spec(broken),
}
if dry_run:
    import posbias

    for name, job in jobs.items():
        planned = posbias.dry_run(job)  # the spec as posbias checks it: variants resolved, context chosen
        runs = ", ".join(v.name for v in planned.spec.runs)
        context = planned.context.describe() if planned.context else "none"
        print(f"would run {name}: {planned.spec.total_trials} trials, variants {runs}, engine context {context}")
    for folder in (gemma2, gemma3):
        text = json.loads((folder / "config.json").read_text())
        print(f"built {folder.name}: head_dim {text['head_dim']}, layer_types {text.get('layer_types')}")
    sys.exit(0)

import posbias  # noqa: E402
from posbias.schemas import EngineOptions  # noqa: E402
from posbias.workers.vllm_engine import VllmEngine  # noqa: E402

assert posbias.load_settings().device == "gpu"
for name, job in list(jobs.items())[:2]:
    outcome = posbias.run(job)
    record = outcome.job
    check(f"{name}: job", record.status.value == "done", record.error or f"{record.trials_total} trials")
    for variant in record.variants:
        engine = variant.engine
        backend = engine.attention_backend if engine else None
        guessed = engine.attention_backend_guessed if engine else True
        check(f"{name}: {variant.name} backend", bool(backend) and not guessed, f"{backend} (guessed: {guessed})")
        asked = variant.expected is None or (variant.built is not None and variant.built.windows == variant.expected.windows)
        windows = variant.built.windows if variant.built else None
        check(f"{name}: {variant.name} read-back", variant.built is not None and asked, f"windows {windows}")

failed = posbias.run(jobs["a load that must fail"]).job
error = failed.error or ""
named = "See root cause above" not in error.split("(")[0] and "exceeds dimension size" in error
check("a load that must fail", failed.status.value == "failed" and named, error[:150])

# GPU memory after release: an engine at half the GPU, closed; free memory polled through NVML.
import pynvml  # noqa: E402

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
before = pynvml.nvmlDeviceGetMemoryInfo(handle).free
engine = VllmEngine(str(gemma2), options=EngineOptions(gpu_memory_utilization=0.5),
                    config=posbias.load_settings().worker_config())
held = pynvml.nvmlDeviceGetMemoryInfo(handle).free
started = time.monotonic()
engine.close()
while pynvml.nvmlDeviceGetMemoryInfo(handle).free < before - 512 * 2**20 and time.monotonic() - started < 120:
    time.sleep(0.1)
seconds = time.monotonic() - started
free = pynvml.nvmlDeviceGetMemoryInfo(handle).free
check("GPU memory free after release", free >= before - 512 * 2**20,
      f"{seconds:.1f} s ({(before - held) / 2**30:.1f} GiB held, {free / 2**30:.1f} GiB free after)")
pynvml.nvmlShutdown()

width = max(len(name) for name, _, _ in rows)
print(f"{'check':<{width}}  result  detail")
for name, result, detail in rows:
    print(f"{name:<{width}}  {result:<6}  {detail}")
sys.exit(0 if all(result == "ok" for _, result, _ in rows) else 1)
PYTHON
fi

if (( hf_only )); then
    python3 "$repo/scripts/gpu_check_hf.py" --work "$work/hf" "$@" || status=$?
elif [[ " $* " == *" --dry-run "* ]]; then
    echo "would run the hf part: scripts/gpu-check.sh hf (the hf engine on CUDA; torch and transformers only)"
else
    python3 "$repo/scripts/gpu_check_hf.py" --work "$work/hf" || status=$?
fi
exit "$status"
