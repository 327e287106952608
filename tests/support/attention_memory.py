"""One hf job's attention, measured: the answer-rows attention against transformers' eager attention on the
same trials, with the time and the peak memory of each pass. Shared by `benchmarks/attention_memory.py` (on
the CPU, each pass in a process of its own) and the hf part of `scripts/gpu-check.sh` (on CUDA, in one
process); needs only torch, transformers and posbias (no Ray, no vLLM).

The job: one trial of `batch_size` questions, with filler before the answer request so that prompt and
answers come to `tokens` tokens, constrained answers, the gold sheet teacher-forced. Peak memory: on CUDA,
torch's own counter (`max_memory_allocated`, above what was allocated before the pass); on the CPU, the
process's resident set sampled every 2 ms in a thread (tracemalloc does not see torch's allocations), above
its size before the pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbias.schemas import AttentionRow, JobSpec, ShardSpec
from posbias.service.settings import Settings
from posbias.service.work import submission
from posbias.service.work.shards import shard_spec
from posbias.workers.hf_engine import HfEngine
from posbias.workers.prompts import render_trial
from support.eager_attention import eager

LONG_CONTEXT = 32_768
"""The tiny long-context model's context: a 32k-token job fits."""

MASSES = (
    "own_mean",
    "own_max",
    "sink_mean",
    "sink_max",
    "other_mean",
    "other_max",
    "instructions_mean",
    "instructions_max",
    "answers_mean",
    "beyond_window_mean",
    "beyond_window_max",
)
"""The stored masses of an `AttentionRow`."""


def long_model_fields(*, sliding_window: int = 4096) -> dict[str, Any]:
    """`build_tiny_model`'s arguments for a tiny random Gemma 2 with a 32k context: four layers (a 4096-token
    window on layers 0 and 2, as the real model's), two heads of 32, logit softcapping 50."""
    return {
        "architecture": "gemma2",
        "max_position_embeddings": LONG_CONTEXT,
        "sliding_window": sliding_window,
    }


def build_long_model(folder: Path, *, sliding_window: int = 4096) -> Path:
    """The tiny long-context Gemma 2 (`long_model_fields`) written to `folder`."""
    from posbias.workers.tiny_models import build_tiny_model

    return build_tiny_model(folder, **long_model_fields(sliding_window=sliding_window))


@dataclass
class Pass:
    """One pass over a job's shards: what it recorded and what it cost."""

    mode: str
    """`rows` (the engine's answer-rows attention) or `eager` (transformers' eager attention)."""
    tokens: int
    """The longest trial's prompt plus answer sheet budget, in tokens."""
    seconds: float
    peak_bytes: int
    """Peak memory above what the process held before the pass."""
    map_bytes: int
    """The largest map of attention weights held at once (`AttentionShard.map_bytes_peak`)."""
    rows: list[AttentionRow]
    probs: list[tuple[float, ...]]
    """Each result's option probabilities."""
    process_bytes: int = 0
    """The whole process's peak resident set (the model's load and its mask canary included), where the pass
    had a process of its own; 0 otherwise."""

    def to_json(self) -> dict[str, Any]:
        """For a pass run in another process."""
        return {
            "mode": self.mode,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "peak_bytes": self.peak_bytes,
            "map_bytes": self.map_bytes,
            "rows": [row.model_dump(mode="json") for row in self.rows],
            "probs": [list(p) for p in self.probs],
            "process_bytes": self.process_bytes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Pass:
        """The inverse of `to_json`."""
        return cls(
            mode=data["mode"],
            tokens=data["tokens"],
            seconds=data["seconds"],
            peak_bytes=data["peak_bytes"],
            map_bytes=data["map_bytes"],
            rows=[AttentionRow.model_validate(row) for row in data["rows"]],
            probs=[tuple(p) for p in data["probs"]],
            process_bytes=data.get("process_bytes", 0),
        )


def job_shards(
    engine: HfEngine,
    *,
    model: str,
    tokens: int,
    batch_size: int,
    settings: Settings,
    dataset: dict[str, Any] | None = None,
) -> list[ShardSpec]:
    """The shards of a one-trial hf job on `model` whose prompt and answer budget come to `tokens` tokens, or
    a token or two under (filler at the end of the questions makes up the difference; its joins with the
    text around it may tokenize a token longer or shorter)."""
    budget = 8 * batch_size + 8  # what the shard runner keeps free for constrained answers
    filler = 0
    for _ in range(4):
        shards = _shards(model, batch_size=batch_size, filler=filler, settings=settings, dataset=dataset)
        trial = shards[0].trials[0]
        rendered = render_trial(
            trial, spec=shards[0], questions=shards[0].questions, tokenizer=engine.tokenizer
        )
        over = len(rendered.token_ids or ()) + budget - tokens
        if filler == 0 and over > 0:
            raise ValueError(
                f"{batch_size} questions take {len(rendered.token_ids or ())} tokens, over {tokens}"
            )
        if -4 < over <= 0:
            return shards
        filler -= over
    raise ValueError(f"no filler length brings the job to {tokens} tokens")


def _shards(
    model: str, *, batch_size: int, filler: int, settings: Settings, dataset: dict[str, Any] | None
) -> list[ShardSpec]:
    fields: dict[str, Any] = {
        "model": model,
        "batch_sizes": [batch_size],
        "iterations": 1,
        "seed": 40,
        "answer_mode": "constrained",
        "engine": {"name": "hf"},
        **({"dataset": dataset} if dataset else {}),
        **({"filler": {"tokens": [filler], "where": "end"}} if filler else {}),
    }
    prepared = submission.prepare(JobSpec.model_validate(fields), settings=settings)
    spec, plan = prepared.spec, prepared.plan
    return [
        shard_spec(
            spec,
            job_id=0,
            shard_id=planned.index,
            trials=[plan.trials[i] for i in planned.trial_indices],
            questions=plan.questions,
            variant=planned.variant,
        )
        for planned in plan.shards
    ]


def measure(engine: HfEngine, shards: Sequence[ShardSpec], *, mode: str, device: str) -> Pass:
    """Run `shards` on `engine` with its own attention (`rows`) or with eager attention (`eager`)."""
    import torch

    context = eager(engine._model) if mode == "eager" else nullcontext()
    with context, _peak(device) as peak:
        started = time.perf_counter()
        results = engine.run_shards(shards)
        seconds = time.perf_counter() - started
    skipped = [t.skip_reason for result in results for t in result.trials if t.status.value != "done"]
    if skipped:
        raise RuntimeError(f"a trial did not run: {skipped[0]}")
    rows = [row for result in results if result.attention for row in result.attention.rows]
    probs = [r.option_probs for result in results for r in result.results if r.option_probs is not None]
    longest = max(
        (t.prompt_tokens or 0) + 8 * len(shard.trials[0].question_ids) + 8
        for result, shard in zip(results, shards, strict=True)
        for t in result.trials
    )
    if device == "cuda":
        torch.cuda.synchronize()
    return Pass(
        mode=mode,
        tokens=longest,
        seconds=seconds,
        peak_bytes=peak[0],
        map_bytes=max((r.attention.map_bytes_peak for r in results if r.attention), default=0),
        rows=rows,
        probs=probs,
    )


@contextmanager
def _peak(device: str) -> Iterator[list[int]]:
    """Yields a one-item list that holds, after the block, its peak memory above the start."""
    found = [0]
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        start = sum(torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count()))
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)
        yield found
        torch.cuda.synchronize()
        top = sum(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count()))
        found[0] = max(0, top - start)
        return
    import psutil

    process = psutil.Process()
    start = process.memory_info().rss
    top = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            top[0] = max(top[0], process.memory_info().rss)
            done.wait(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        done.set()
        thread.join()
        top[0] = max(top[0], process.memory_info().rss)
        found[0] = top[0] - start


def differences(a: Pass, b: Pass) -> tuple[float, float]:
    """The largest difference between two passes' masses (every stored mass of every row) and between their
    option probabilities; raises `AssertionError` when they did not record the same rows."""
    assert [(r.trial_index, r.position, r.layer) for r in a.rows] == [
        (r.trial_index, r.position, r.layer) for r in b.rows
    ], "the passes recorded different rows"
    masses = 0.0
    for x, y in zip(a.rows, b.rows, strict=True):
        for name in MASSES:
            mine, theirs = getattr(x, name), getattr(y, name)
            assert (mine is None) == (theirs is None), name
            if mine is not None:
                masses = max(masses, abs(mine - theirs))
    probs = max(
        (abs(p - q) for x, y in zip(a.probs, b.probs, strict=True) for p, q in zip(x, y, strict=True)),
        default=0.0,
    )
    return masses, probs


def mib(size: float) -> str:
    """Bytes in KiB below 1 MiB, in MiB, or in GiB from 10 GiB."""
    if size >= 10 * 2**30:
        return f"{size / 2**30:.1f} GiB"
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"
