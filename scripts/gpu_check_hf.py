"""The hf part of the GPU check (`scripts/gpu-check.sh hf`): the `hf` engine in this process on CUDA, with
nothing but torch, transformers and posbias (no Ray, no vLLM), so it runs on a bare GPU machine.

    scripts/gpu-check.sh hf                                         # on the GPU; a few minutes
    scripts/gpu-check.sh hf --device cpu --tokens 1024,2048 --batch-size 4 --window 256   # as the tests do

From tiny random-weights models it builds in a scratch folder (Gemma 2 with head size 256, as the real
model's; Gemma 3 with five sliding layers, then one global; a Gemma 2 with a 32k context):

  - the engine on the device in float32 and in bfloat16 against the same jobs on the CPU in float32: every
    option probability and every attention mass within 1e-4 (float32) and 2e-2 (bfloat16);
  - the memory handed back when the engine closes: the model object gone, and on CUDA
    `torch.cuda.memory_allocated` back where it was before the load;
  - the answer-rows attention against transformers' eager attention on one job of `--tokens` tokens (8k and
    32k by default) on the long model (a 4096-token window on two of its four layers, or `--window`): time,
    peak memory, the largest map held, and their agreement (1e-4, float32); eager is reported as not
    fitting where the device runs out of memory.

It prints its comparisons and one table, and exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.attention_memory import Pass, build_long_model, differences, job_shards, measure, mib

from posbias.schemas import EngineOptions, JobSpec, ShardSpec, WorkerConfig
from posbias.service.settings import Settings
from posbias.service.work import submission
from posbias.service.work.shards import shard_spec
from posbias.workers.hf_engine import HfEngine
from posbias.workers.tiny_models import build_tiny_model

TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}
"""Largest difference allowed with the CPU in float32, by the device's dtype."""
RELEASED_SLACK = 16 * 2**20
"""Bytes CUDA may still hold after a close (cuBLAS's workspace is allocated on first use)."""

rows: list[tuple[str, str, str]] = []


def check(name: str, ok: bool, detail: str) -> None:
    rows.append((name, "ok" if ok else "FAIL", detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="Where the engine runs.")
    parser.add_argument("--tokens", default="8192,32768", help="Job lengths of the eager comparison.")
    parser.add_argument("--batch-size", type=int, default=20, help="Questions in the long job's trial.")
    parser.add_argument(
        "--window", type=int, default=4096, help="The long model's sliding window (its canary is 3 windows)."
    )
    parser.add_argument("--work", type=Path, default=None, help="Scratch folder (default: a new one).")
    return parser.parse_args(argv)


def questions(folder: Path) -> dict[str, Any]:
    """Questions in MMLU's JSONL layout, written here (no download): the jobs' dataset."""
    path = folder / "questions.jsonl"
    with path.open("w") as out:
        for i in range(60):
            words = " ".join(f"word{(i * 7 + k) % 50}" for k in range(12 + i % 9))
            choices = [f"{i + k} {words[: 10 + k]}" for k in range(4)]
            line = {"question": f"Which is {i}? {words}", "subject": "arithmetic", "choices": choices}
            out.write(json.dumps(line | {"answer": i % 4}) + "\n")
    return {"path": str(path)}


def shards_of(model: Path, *, settings: Settings, dataset: dict[str, Any]) -> list[ShardSpec]:
    spec = JobSpec.model_validate(
        {
            "model": str(model),
            "batch_sizes": [3, 8],
            "iterations": 2,
            "seed": 40,
            "answer_mode": "constrained",
            "engine": {"name": "hf"},
            "dataset": dataset,
        }
    )
    prepared = submission.prepare(spec, settings=settings)
    plan = prepared.plan
    return [
        shard_spec(
            prepared.spec,
            job_id=0,
            shard_id=planned.index,
            trials=[plan.trials[i] for i in planned.trial_indices],
            questions=plan.questions,
        )
        for planned in plan.shards
    ]


def allocated(device: str) -> tuple[int, int]:
    """Bytes CUDA's allocator has handed out and holds (0, 0 on the CPU)."""
    if device != "cuda":
        return 0, 0
    import torch

    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())


def engine_on(model: Path, *, device: str, dtype: str, config: WorkerConfig) -> HfEngine:
    return HfEngine(str(model), options=EngineOptions(name="hf", dtype=dtype), config=config, device=device)


def released(engine: HfEngine, *, device: str, before: tuple[int, int], name: str) -> None:
    """Close `engine` and check its model is gone and, on CUDA, its memory handed back."""
    model = weakref.ref(engine._model)
    engine.close()
    gc.collect()
    if device == "cuda":
        import torch

        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
    after = allocated(device)
    gone = model() is None
    ok = gone and after[0] <= before[0] + RELEASED_SLACK
    detail = f"model object {'gone' if gone else 'still referenced'}"
    if device == "cuda":
        detail += (
            f"; allocated {mib(before[0])} before the load, {mib(after[0])} after close; "
            f"reserved {mib(after[1])} after close"
        )
    check(f"{name}: memory after close", ok, detail)


def against_cpu(model: Path, *, name: str, device: str, settings: Settings, dataset: dict[str, Any]) -> None:
    config = WorkerConfig(cache_dir=str(settings.cache_dir))
    shards = shards_of(model, settings=settings, dataset=dataset)
    reference = engine_on(model, device="cpu", dtype="float32", config=config)
    try:
        expected = measure(reference, shards, mode="rows", device="cpu")
    finally:
        reference.close()
    for dtype, tolerance in TOLERANCE.items():
        before = allocated(device)
        engine = engine_on(model, device=device, dtype=dtype, config=config)
        try:
            found = measure(engine, shards, mode="rows", device=device)
            canary = engine.canary.passed
        finally:
            released(engine, device=device, before=before, name=f"{name} {dtype}")
        masses, probs = differences(found, expected)
        check(
            f"{name} {dtype} on {device} against cpu float32",
            canary and masses <= tolerance and probs <= tolerance,
            f"masses within {masses:.1e}, option probabilities within {probs:.1e} (allowed {tolerance:g}; "
            f"{len(found.rows)} rows, {len(found.probs)} answers; canary {'passed' if canary else 'FAILED'})",
        )


def rows_against_eager(
    model: Path, *, device: str, sizes: Sequence[int], batch_size: int, settings: Settings, dataset: Any
) -> None:
    import torch

    config = WorkerConfig(cache_dir=str(settings.cache_dir))
    engine = engine_on(model, device=device, dtype="float32", config=config)
    table = []
    try:
        for tokens in sizes:
            shards = job_shards(
                engine,
                model=str(model),
                tokens=tokens,
                batch_size=batch_size,
                settings=settings,
                dataset=dataset,
            )
            ours = measure(engine, shards, mode="rows", device=device)
            theirs: Pass | None = None
            why = ""
            try:
                theirs = measure(engine, shards, mode="eager", device=device)
            except torch.OutOfMemoryError as exc:
                why = f"eager did not fit: {str(exc).splitlines()[0][:120]}"
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            table.append((ours, theirs))
            if theirs is None:
                check(f"answer rows at {ours.tokens:,} tokens", bool(ours.rows), why)
                continue
            masses, probs = differences(ours, theirs)
            tolerance = TOLERANCE["float32"]
            check(
                f"answer rows against eager at {ours.tokens:,} tokens",
                masses <= tolerance and probs <= tolerance,
                f"masses within {masses:.1e}, option probabilities within {probs:.1e}; peak "
                f"{mib(ours.peak_bytes)} against {mib(theirs.peak_bytes)}, {ours.seconds:.2f} s against "
                f"{theirs.seconds:.2f} s",
            )
    finally:
        engine.close()
    peak = (
        "CUDA's peak allocated"
        if device == "cuda"
        else "peak resident set (one process: freed memory is reused)"
    )
    print(f"\nanswer rows against eager on {device}, float32 ({model.name}, N = {batch_size}; {peak}):")
    print("| tokens | rows: s | rows: peak | eager: s | eager: peak | peak eager/rows | largest map held |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for ours, theirs in table:
        if theirs is None:
            print(f"| {ours.tokens:,} | {ours.seconds:.2f} | {mib(ours.peak_bytes)} | did not fit | | | |")
            continue
        ratio = theirs.peak_bytes / max(ours.peak_bytes, 1)
        maps = f"{mib(ours.map_bytes)} against {mib(theirs.map_bytes)}"
        print(
            f"| {ours.tokens:,} | {ours.seconds:.2f} | {mib(ours.peak_bytes)} | {theirs.seconds:.2f} | "
            f"{mib(theirs.peak_bytes)} | {ratio:.1f} | {maps} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device here (run with --device cpu to try it on the CPU)")
        return 1
    work = args.work or Path(tempfile.mkdtemp(prefix="posbias-gpu-check-hf."))
    work.mkdir(parents=True, exist_ok=True)
    settings = Settings(cache_dir=work / "cache")
    dataset = questions(work)
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"hf engine on {args.device} ({where}); torch {torch.__version__}", flush=True)
    gemma2 = build_tiny_model(work / "gemma2", architecture="gemma2", head_dim=256, sliding_window=64)
    gemma3 = build_tiny_model(work / "gemma3", architecture="gemma3", num_layers=6, sliding_window=48)
    for name, model in (("gemma2 (head size 256)", gemma2), ("gemma3", gemma3)):
        against_cpu(model, name=name, device=args.device, settings=settings, dataset=dataset)
    sizes = [int(n) for n in args.tokens.split(",")]
    rows_against_eager(
        build_long_model(work / "long", sliding_window=args.window),
        device=args.device,
        sizes=sizes,
        batch_size=args.batch_size,
        settings=settings,
        dataset=dataset,
    )
    width = max(len(name) for name, _, _ in rows)
    print(f"\n{'check':<{width}}  result  detail")
    for name, result, detail in rows:
        print(f"{name:<{width}}  {result:<6}  {detail}")
    return 0 if all(result == "ok" for _, result, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
