"""Served-model benchmark: one fixed set of MMLU trials (constrained answers) answered by the in-process
engine and through a real `vllm serve` of the same model, side by side in one run.

    python benchmarks/served.py                      # the tiny and the demo model, ~10 minutes on 2 cores
    python benchmarks/served.py --setting tiny --trials 400 --concurrency 1,4,16,64

(a) in-process: `VllmEngine` (vLLM in this process, as a worker runs it), all the trials' shards in one
    `run_shards` call, as a worker answers one engine call: render, one `generate`, parse.
(b) served: `OpenAIEngine` against `vllm serve` on 127.0.0.1 (the CPU build, started with the in-process
    engine's CPU settings, tests/support/vllmserve.py), the same `run_shards` call, at each `--concurrency`
    (requests in flight). Prompts go as the server's token ids, so both answer the same tokens; the run
    checks that they wrote the same answers. Every served run starts with an empty request cache (else the
    second run would be free).

Both engines live on the same cores and take turns (the idle one does no work). Each is run once untimed
first (first use compiles kernels and, on the server, the answer grammar), then `--repeats` times, the order
alternating per repeat; medians are printed, with each served level's trials/s over the in-process figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from posbias.schemas import JobSpec, ShardResult, ShardSpec, WorkerConfig
from posbias.service.settings import Settings
from posbias.service.work import submission
from posbias.service.work.shards import shard_spec
from posbias.workers.engine import Engine
from posbias.workers.shard import run_shards

# tests/support (tiny models, the vllm serve launcher) is shared with the tests; not part of the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


@dataclass(frozen=True)
class Setting:
    """One configuration of the benchmark."""

    name: str
    batch_size: int
    trials: int


SETTINGS = {
    "tiny": Setting("tiny", batch_size=8, trials=32),  # 10 questions overflow its 4,096-token context
    "demo": Setting("demo", batch_size=5, trials=8),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setting", choices=[*SETTINGS, "both"], default="both", help="which model(s)")
    parser.add_argument("--trials", type=int, help="trials (default: the setting's)")
    parser.add_argument("--batch-size", type=int, help="questions per prompt (default: the setting's)")
    parser.add_argument(
        "--concurrency", default="1,4,16", help="requests in flight for the served runs, e.g. 1,4,16"
    )
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each (default 2)")
    return parser.parse_args(argv)


def job_spec(model: str, *, batch_size: int, trials: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": model,
            "batch_sizes": [batch_size],
            "iterations": trials,
            "answer_mode": "constrained",
            "seed": 3,
        }
    )


def shards_of(spec: JobSpec, prepared: submission.Prepared) -> list[ShardSpec]:
    plan = prepared.plan
    return [
        shard_spec(
            spec,
            job_id=1,
            shard_id=s.index,
            trials=[plan.trials[i] for i in s.trial_indices],
            questions=plan.questions,
        )
        for s in plan.shards
    ]


def answers(results: Sequence[ShardResult]) -> list[tuple[object, ...]]:
    """What a run wrote, to check both engines answered alike."""
    return [
        (r.trial_index, r.position, r.predicted, r.parse_status, r.answer_token_index, r.question_token_start)
        for result in results
        for r in result.results
    ]


@dataclass(frozen=True)
class Run:
    seconds: float
    trials: int
    answers: list[tuple[object, ...]]

    @property
    def trials_per_second(self) -> float:
        return self.trials / self.seconds


def timed(engine: Engine, shards: Sequence[ShardSpec]) -> Run:
    started = time.perf_counter()
    results = run_shards(shards, engine=engine)
    seconds = time.perf_counter() - started
    return Run(seconds=seconds, trials=sum(len(r.trials) for r in results), answers=answers(results))


def load_average() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def bench(setting: Setting, *, options: argparse.Namespace, workdir: Path) -> None:
    from support.tinymodels import build_tiny_model
    from support.vllmserve import vllm_serve

    from posbias.workers.gguf_files import convert_gguf
    from posbias.workers.models import demo_model_path
    from posbias.workers.openai_engine import OpenAIEngine
    from posbias.workers.vllm_engine import VllmEngine

    settings = Settings()
    cache = Path(settings.cache_dir)
    batch_size = options.batch_size or setting.batch_size
    trials = options.trials or setting.trials
    levels = [int(x) for x in options.concurrency.split(",") if x.strip()]
    if setting.name == "tiny":
        folder = build_tiny_model(workdir / "tiny-llama", architecture="llama")
        model, served_name, described = (
            str(folder),
            None,
            "a tiny random Llama built here (4 layers, hidden 64)",
        )
    else:
        folder = convert_gguf(demo_model_path(), cache_dir=cache)
        model, served_name, described = "demo", "demo", "SmolLM2-135M-Instruct (`demo`), float32"
    spec = job_spec(model, batch_size=batch_size, trials=trials)
    prepared = submission.prepare(spec, settings=settings)
    local_shards = shards_of(spec, prepared)
    print(
        f"\n== {setting.name}: {described}\n   batch size {batch_size}, {trials} trials of "
        f"{prepared.pool.source}, constrained answers, {len(local_shards)} shards in one run_shards call",
        flush=True,
    )
    config = WorkerConfig(cache_dir=str(cache), cpu_kvcache_gib=settings.cpu_kvcache_gib)
    started = time.perf_counter()
    local = VllmEngine(model, config=config)
    print(f"   in-process engine loaded in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        timed(local, local_shards)  # warm-up, untimed
        started = time.perf_counter()
        with vllm_serve(
            folder,
            cache_dir=cache,
            log=workdir / f"vllm-serve-{setting.name}.log",
            served_model=served_name,
            max_model_len=local.max_model_len,
            kv_cache_gib=settings.cpu_kvcache_gib,
        ) as server:
            print(
                f"   vllm serve up in {time.perf_counter() - started:.1f} s ({server.base_url})", flush=True
            )

            def served_run(concurrency: int) -> Callable[[], Run]:
                def run() -> Run:
                    engine_options = {
                        "name": "openai",
                        "base_url": server.base_url,
                        "max_concurrency": concurrency,
                    }
                    served_spec = JobSpec.model_validate({**spec.model_dump(), "engine": engine_options})
                    fresh = tempfile.mkdtemp(prefix="served-cache-", dir=workdir)
                    engine = OpenAIEngine(served_spec, config=WorkerConfig(cache_dir=fresh))
                    try:
                        return timed(engine, shards_of(served_spec, prepared))
                    finally:
                        engine.close()

                return run

            served_run(max(levels))()  # warm-up: the server compiles the answer grammar on first use
            locals_: list[Run] = []
            served: dict[int, list[Run]] = {c: [] for c in levels}
            for repeat in range(1, options.repeats + 1):
                print(f"   repeat {repeat}", flush=True)
                pairs: list[tuple[str, list[Run], Callable[[], Run]]] = [
                    ("(a) in-process", locals_, lambda: timed(local, local_shards))
                ]
                pairs += [(f"(b) served, {c} in flight", served[c], served_run(c)) for c in levels]
                for label, runs, call in pairs if repeat % 2 else pairs[::-1]:
                    run = call()
                    runs.append(run)
                    print(
                        f"    {label:<28}{run.seconds:8.2f} s  {run.trials_per_second:8.2f} trials/s",
                        flush=True,
                    )
    finally:
        local.close()

    def median(runs: Sequence[Run]) -> Run:
        return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]

    a = median(locals_)
    same = all(run.answers == a.answers for runs in served.values() for run in runs)
    print(f"\n   {'':30}{'trials/s':>10}{'seconds':>9}{'served / in-process':>22}")
    print(f"   {'(a) in-process, one call':30}{a.trials_per_second:10.2f}{a.seconds:9.2f}")
    for c in levels:
        b = median(served[c])
        ratios = [s.trials_per_second / x.trials_per_second for s, x in zip(served[c], locals_, strict=True)]
        print(
            f"   {f'(b) served, {c} in flight':30}{b.trials_per_second:10.2f}{b.seconds:9.2f}"
            f"{statistics.median(ratios):21.3f}x"
        )
    print(f"   same answers served and in-process: {'yes' if same else 'NO'}")
    print(f"   {load_average()}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_args(argv)
    names = list(SETTINGS) if options.setting == "both" else [options.setting]
    print(f"served-model benchmark, {date.today()}, {os.cpu_count()} CPUs, {load_average()}")
    with tempfile.TemporaryDirectory(prefix="posbias-served-") as scratch:
        for name in names:
            bench(SETTINGS[name], options=options, workdir=Path(scratch))


if __name__ == "__main__":
    main()
