"""Throughput benchmark: one fixed set of MMLU trials (constrained answers) answered three ways, side by side
in one run.

    python benchmarks/throughput.py                      # every default setting, about 6 minutes on 2 cores
    python benchmarks/throughput.py --setting tiny       # only the tiny random model
    python benchmarks/throughput.py --setting filler --skip-hf   # a filler design (random order, 0/1000)
    python benchmarks/throughput.py --model google/gemma-2-2b-it --batch-size 10 --trials 2000 \\
        --tensor-parallel-size 1 --database-url postgresql+psycopg://...      # any model, on GPUs

(a) raw vLLM: the trials rendered with `workers/prompts.py` (so the prompts are token for token posbias's),
    then one `vllm.LLM.generate` call on all of them, with the sampling parameters posbias sends (greedy, the
    answer-sheet regex, option log-probabilities). The ceiling of posbias's engine path.
(b) posbias end to end: the job is submitted to the SQL queue and one dispatcher runs it on a Ray actor that
    holds the engine, to the last result row committed. Timed from `queue.submit` to the commit of the last
    shard's results. The model load is not in it: the actor is loaded (and the job run once, untimed) before
    the timed runs; its load time is printed on its own.
(c) what a user does without posbias (the seed's loop): one prompt at a time through Hugging Face
    transformers `generate`, greedy. transformers has no constrained decoding, so this is free generation with
    the same output budget (it stops earlier when the model ends its turn).

Rendering is counted in (a), (b) and (c) alike; parsing the answers and writing them only in (b), which is
the point. (a) and (b) each run the whole set once untimed first (kernels compile and the CPU build's
matmul primitives are created per shape on first use), then `--repeats` times alternately; medians are
printed, and b/a is the median of the per-repeat ratios. (c) runs once, on the first `--hf-trials` trials.
Both engines start with the arguments posbias gives `vllm.LLM` (`workers/vllm_start.py`); on GPUs both share
one GPU, so each gets `--gpu-memory-utilization` (default 0.4) of it.

Three default settings: `tiny`, a 4-layer random Llama with hidden size 64 built here
(`tests/support/tinymodels.py`), where prefill is cheap and posbias's own overhead shows; `demo`,
SmolLM2-135M-Instruct, a handful of trials at batch size 5; and `filler`, the tiny model in a design that
separates the suspects (a random answer order, every set with no filler and with 1,000 filler tokens before
the answer request). (a) and (c) render with the job's filler and seed, so every way answers the same prompts
token for token, and ask for the answers in the order each prompt states.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from posbias.schemas import AnswerMode, JobSpec, Question, ShardResult, Trial
from posbias.service.dispatch.dispatcher import Dispatcher
from posbias.service.dispatch.pools import SHARDS_PER_CALL
from posbias.service.dispatch.ray_connect import init_ray
from posbias.service.settings import Settings
from posbias.service.store import database, migrate
from posbias.service.store.database import Database
from posbias.service.work import jobs, submission

# tests/support (throwaway PostgreSQL, tiny models) is shared with the tests; not part of the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import Guard

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Setting:
    """One configuration of the benchmark."""

    name: str
    model: str | None
    """None: the tiny random model, built here."""
    batch_size: int
    trials: int
    """Iterations: sampled sets (trials, without a filler sweep)."""
    hf_trials: int
    design: dict[str, Any] = field(default_factory=dict)
    """Job spec fields of the design (answer order, filler); the default: the seed's."""


SETTINGS = {
    "tiny": Setting(name="tiny", model=None, batch_size=10, trials=200, hf_trials=10),
    "demo": Setting(name="demo", model="demo", batch_size=5, trials=10, hf_trials=5),
    "filler": Setting(
        name="filler",
        model=None,
        batch_size=10,
        trials=100,
        hf_trials=10,
        design={"answer_order": "random", "filler": {"tokens": [0, 1000], "where": "end"}},
    ),
}
"""`filler`: the tiny model, a random answer order and each of 100 sets with no filler and with 1,000 tokens
of the built-in filler before the answer request (200 trials, about twice the prompt tokens of `tiny`)."""


@dataclass(frozen=True)
class Run:
    """One timed pass over the trials."""

    seconds: float
    trials: int
    """Trials answered (skipped ones, whose prompt does not fit the context, are not counted)."""
    prompt_tokens: int
    output_tokens: int
    engine_seconds: float
    """Inside the engine's generate calls (for (b), as the actor timed them)."""

    @property
    def trials_per_second(self) -> float:
        return self.trials / self.seconds

    @property
    def tokens_per_second(self) -> float:
        """Prompt and output tokens processed per second."""
        return (self.prompt_tokens + self.output_tokens) / self.seconds


def balanced_ratio(b_second: Sequence[float], b_first: Sequence[float]) -> float:
    """b/a with both orders weighed equally: the geometric mean of the median ratio of the repeats where (b)
    ran second and of those where it ran first. If whichever engine runs second takes (1 + c) times as long,
    the first is the true ratio over (1 + c) and the second the true ratio times (1 + c): their geometric
    mean is the true ratio."""
    return math.sqrt(statistics.median(b_second) * statistics.median(b_first))


# --- (a) raw vLLM -------------------------------------------------------------------------------------


def start_raw_llm(spec: JobSpec, *, settings: Settings) -> Any:
    """A `vllm.LLM` started exactly as posbias's `VllmEngine` starts it."""
    from posbias.workers.models import resolve_model
    from posbias.workers.vllm_start import start_llm

    resolved = resolve_model(
        spec.model, revision=spec.revision, tokenizer=spec.tokenizer, cache_dir=settings.cache_dir
    )
    llm, _device = start_llm(
        resolved,
        options=spec.engine,
        config=settings.worker_config(),
        hf_overrides=dict(spec.engine.hf_overrides),
    )
    return llm


def run_raw(llm: Any, spec: JobSpec, trials: Sequence[Trial], questions: dict[str, Question]) -> Run:
    """Render every trial, then answer all of them in one `LLM.generate` call."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    from posbias.workers.prompts import answer_regex, render_trial
    from posbias.workers.tokenizer import HfTokenizer

    started = time.perf_counter()
    tokenizer = HfTokenizer(llm.get_tokenizer())
    max_model_len = llm.llm_engine.model_config.max_model_len
    prompts, params = [], []
    for trial in trials:
        rendered = render_trial(trial, spec=spec, questions=questions, tokenizer=tokenizer)
        token_ids = list(rendered.token_ids or ())
        max_tokens = spec.sampling.max_tokens_for(len(rendered.asked), answer_mode=spec.answer_mode)
        if len(token_ids) + max_tokens > max_model_len:
            continue  # posbias skips it too
        prompts.append(TokensPrompt(prompt_token_ids=token_ids))
        params.append(
            SamplingParams(
                temperature=spec.sampling.temperature,
                top_p=spec.sampling.top_p,
                max_tokens=max_tokens,
                logprobs=max(max(rendered.n_options), 5),  # as VllmEngine asks: option probabilities
                structured_outputs=StructuredOutputsParams(
                    regex=answer_regex(rendered.n_options, asked=rendered.asked)
                ),
            )
        )
    rendered_at = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    return Run(
        seconds=seconds,
        engine_seconds=seconds - (rendered_at - started),
        trials=len(outputs),
        prompt_tokens=sum(len(p["prompt_token_ids"]) for p in prompts),
        output_tokens=sum(len(o.outputs[0].token_ids) for o in outputs),
    )


# --- (b) posbias end to end ---------------------------------------------------------------------------


def run_posbias(db: Database, dispatcher: Dispatcher, prepared: submission.Prepared) -> Run:
    """Submit the job and dispatch it to the end; timed from submit to the last shard's commit."""
    last_commit = engine_seconds = 0.0

    def written(result: ShardResult) -> None:
        nonlocal last_commit, engine_seconds
        last_commit = time.perf_counter()
        engine_seconds += result.generate_seconds  # the shard's share of its engine call

    started = time.perf_counter()
    job_id = jobs.submit(db, prepared.spec, prepared.plan).job_id
    dispatcher.run(until_empty=True, on_written=written)
    seconds = last_commit - started
    with db.read() as session:
        done, prompt_tokens, output_tokens, rows = session.execute(
            sa.text(
                "SELECT count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(output_tokens), 0), "
                "(SELECT count(*) FROM results WHERE job_id = :job) "
                "FROM trials WHERE job_id = :job AND status = 'done'"
            ),
            {"job": job_id},
        ).one()
    expected = sum(t.batch_size for t in prepared.plan.trials)
    if rows != expected:
        raise SystemExit(f"job {job_id} wrote {rows} result rows, expected {expected}")
    return Run(
        seconds=seconds,
        trials=done,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        engine_seconds=engine_seconds,
    )


# --- (c) Hugging Face transformers, one prompt at a time ----------------------------------------------


def start_hf(spec: JobSpec, *, settings: Settings) -> tuple[Any, Any]:
    """The model and tokenizer in transformers (float32 on CPU, the model's dtype on a GPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posbias.workers.models import resolve_model

    resolved = resolve_model(
        spec.model, revision=spec.revision, tokenizer=spec.tokenizer, cache_dir=settings.cache_dir
    )
    tokenizer = AutoTokenizer.from_pretrained(
        resolved.tokenizer or resolved.model, revision=resolved.revision
    )
    if torch.cuda.is_available():
        model = AutoModelForCausalLM.from_pretrained(
            resolved.model, revision=resolved.revision, dtype="auto", device_map="auto"
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(resolved.model, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def run_hf(
    model: Any, tokenizer: Any, spec: JobSpec, trials: Sequence[Trial], questions: dict[str, Question]
) -> Run:
    """Render each trial and `generate` its answer greedily, one prompt at a time."""
    import torch

    from posbias.workers.prompts import render_trial
    from posbias.workers.tokenizer import HfTokenizer

    wrapped = HfTokenizer(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompt_tokens = output_tokens = 0
    engine_seconds = 0.0
    started = time.perf_counter()
    for trial in trials:
        rendered = render_trial(trial, spec=spec, questions=questions, tokenizer=wrapped)
        ids = torch.tensor([rendered.token_ids], device=model.device)
        max_tokens = spec.sampling.max_tokens_for(len(rendered.asked), answer_mode=AnswerMode.constrained)
        generating = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        engine_seconds += time.perf_counter() - generating
        prompt_tokens += ids.shape[1]
        output_tokens += out.shape[1] - ids.shape[1]
    seconds = time.perf_counter() - started
    return Run(
        seconds=seconds,
        trials=len(trials),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        engine_seconds=engine_seconds,
    )


# --- the benchmark ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What the command line asked for, beyond the setting."""

    repeats: int
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int | None
    database_url: str | None
    skip_hf: bool
    settle_seconds: float = 2.0
    """Idle time before each timed pass, so that neither starts while the other's threads still spin
    or its writes still finish (the order effect of issue 25)."""


def job_spec(model: str, setting: Setting, options: Options) -> JobSpec:
    """The benchmark's job: one batch size, constrained answers, the planner's default shard size."""
    return JobSpec.model_validate(
        {
            "model": model,
            "batch_sizes": [setting.batch_size],
            "iterations": setting.trials,
            "answer_mode": "constrained",
            **setting.design,
            "engine": {
                "tensor_parallel_size": options.tensor_parallel_size,
                "gpu_memory_utilization": options.gpu_memory_utilization,
                "max_model_len": options.max_model_len,
            },
        }
    )


def load_average() -> str:
    """The machine's load, printed with the figures: other work on a shared machine moves them."""
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(label: str, call: Callable[[], Run]) -> Run:
    run = call()
    print(
        f"    {label:<28}{run.seconds:8.2f} s  {run.trials_per_second:8.2f} trials/s   "
        f"{run.engine_seconds:6.2f} s of it in the engine",
        flush=True,
    )
    return run


def bench(setting: Setting, *, options: Options, settings: Settings, workdir: Path) -> None:
    """Run one setting and print its table."""
    from support.tinymodels import build_tiny_model

    if setting.model is None:
        model = str(
            build_tiny_model(
                workdir / f"tiny-llama-{setting.name}", architecture="llama", max_position_embeddings=16384
            )
        )
        described = (
            "a tiny random Llama built here (4 layers, hidden size 64, byte-level BPE of 1,024 tokens)"
        )
    else:
        model = setting.model
        described = "SmolLM2-135M-Instruct (`demo`), float32" if model == "demo" else model
    spec = job_spec(model, setting, options)
    prepared = submission.prepare(spec, settings=settings)
    trials, questions = prepared.plan.trials, prepared.plan.questions
    print(
        f"\n== {setting.name}: {described}\n   batch size {setting.batch_size}, {len(trials)} trials of "
        f"{prepared.pool.source}, constrained answers;\n   {prepared.spec.describe_design()}\n"
        f"   posbias: {len(prepared.plan.shards)} shards of up "
        f"to {len(prepared.plan.shards[0].trial_indices)} trials (the planner's default), up to "
        f"{SHARDS_PER_CALL} shards per engine call (service/dispatch/pools.py)",
        flush=True,
    )

    url = options.database_url or f"sqlite:///{workdir / f'throughput-{setting.name}.db'}"
    migrate.upgrade(url)
    with database.connect(url) as db:
        dispatcher = Dispatcher(db, settings=settings)
        llm = None
        try:
            started = time.perf_counter()
            jobs.submit(db, prepared.spec, prepared.plan)
            warm = dispatcher.run(until_empty=True)
            warm_seconds = time.perf_counter() - started
            load = sum(warm.load_seconds.values())
            print(
                f"   posbias warm-up (untimed): actor model load {load:.1f} s (its LoadReport), "
                f"first job in all {warm_seconds:.1f} s",
                flush=True,
            )

            started = time.perf_counter()
            llm = start_raw_llm(spec, settings=settings)
            raw_load = time.perf_counter() - started
            run_raw(llm, spec, trials, questions)
            print(f"   raw vLLM warm-up (untimed): load {raw_load:.1f} s, first pass done", flush=True)

            raws: list[Run] = []
            ours: list[Run] = []
            for repeat in range(1, options.repeats + 1):
                print(f"   repeat {repeat}", flush=True)
                # Alternate which goes first, so a drift in the machine's load favours neither.
                pair = [
                    (raws, "(a) raw vLLM", lambda: run_raw(llm, spec, trials, questions)),
                    (ours, "(b) posbias", lambda: run_posbias(db, dispatcher, prepared)),
                ]
                for runs, label, call in pair if repeat % 2 else pair[::-1]:
                    time.sleep(options.settle_seconds)
                    runs.append(timed(label, call))
        finally:
            dispatcher.close()
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()

    hf: Run | None = None
    if not options.skip_hf:
        hf_model, hf_tokenizer = start_hf(spec, settings=settings)
        subset = trials[: setting.hf_trials]
        hf = timed(
            f"(c) transformers, {len(subset)} trials",
            lambda: run_hf(hf_model, hf_tokenizer, spec, subset, questions),
        )

    def median(runs: Sequence[Run]) -> Run:
        return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]

    a, b = median(raws), median(ours)
    print(
        f"\n   {'':30}{'trials/s':>10}{'tokens/s':>11}{'seconds':>9}{'in engine':>11}{'trials':>8}"
        f"{'out tok/trial':>15}"
    )
    rows: list[tuple[str, Run]] = [("(a) raw vLLM, one call", a), ("(b) posbias end to end", b)]
    if hf is not None:
        rows.append(("(c) transformers, one by one", hf))
    for label, run in rows:
        print(
            f"   {label:30}{run.trials_per_second:10.2f}{run.tokens_per_second:11,.0f}{run.seconds:9.2f}"
            f"{run.engine_seconds:11.2f}{run.trials:8}{run.output_tokens / run.trials:15.1f}"
        )
    ratios = [o.trials_per_second / r.trials_per_second for r, o in zip(raws, ours, strict=True)]
    print(
        f"   b/a (trials/s): {statistics.median(ratios):.3f} (median of {len(ratios)} repeats: "
        f"{', '.join(f'{x:.3f}' for x in ratios)})"
    )
    # Odd repeats run (a) first, even ones (b) first: the order effect, if any, is the difference.
    b_second, b_first = ratios[0::2], ratios[1::2]
    if b_first and b_second:
        print(
            f"   b/a by order: {statistics.median(b_second):.3f} with (b) second, "
            f"{statistics.median(b_first):.3f} with (b) first; in engine (medians): "
            f"(a) {statistics.median(r.engine_seconds for r in raws):.2f} s, "
            f"(b) {statistics.median(o.engine_seconds for o in ours):.2f} s"
        )
        # An odd number of repeats runs (b) second once more than first, so a cost of running second tilts
        # the plain median against (b); the geometric mean of the two orders' medians weighs them equally
        # and cancels a cost that either engine pays when it runs second (benchmarks/README.md).
        print(f"   b/a, both orders weighed equally: {balanced_ratio(b_second, b_first):.3f}")
    guard = Guard.read("Throughput")
    then = guard.throughput(setting.name)
    print(guard.line(f"{setting.name} (a) trials/s", now=a.trials_per_second, then=then.get("a")))
    print(guard.line(f"{setting.name} (b) trials/s", now=b.trials_per_second, then=then.get("b")))
    print(guard.line(f"{setting.name} b/a", now=statistics.median(ratios), then=then.get("b/a")))
    if hf is not None:
        print(
            f"   b/c (trials/s): {b.trials_per_second / hf.trials_per_second:.1f}; "
            f"(tokens/s): {b.tokens_per_second / hf.tokens_per_second:.1f}"
        )
    print(f"   {load_average()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--setting", choices=[*SETTINGS, "all"], default="all", help="default settings to run"
    )
    parser.add_argument("--model", help="any model posbias accepts (hub id, folder, .gguf, demo)")
    parser.add_argument("--batch-size", type=int, help="questions per prompt (N)")
    parser.add_argument("--trials", type=int, help="trials (prompts) in the set")
    parser.add_argument("--hf-trials", type=int, help="trials (c) answers: the first of the set")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.4, help="per engine (two share a GPU)"
    )
    parser.add_argument("--max-model-len", type=int, help="context length for both engines")
    parser.add_argument("--database-url", help="store for (b); a temporary SQLite file when not given")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes of (a) and (b)")
    parser.add_argument("--skip-hf", action="store_true", help="leave out (c)")
    parser.add_argument(
        "--settle", type=float, default=2.0, help="idle seconds before each timed pass of (a) and (b)"
    )
    args = parser.parse_args()

    # vLLM's and Ray's progress lines would bury the table.
    logging.getLogger().setLevel(logging.WARNING)
    settings = Settings(
        mmlu_dir=Settings().mmlu_dir or REPO.parent / "shared" / "data" / "mmlu",
    )
    options = Options(
        repeats=args.repeats,
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        database_url=args.database_url,
        skip_hf=args.skip_hf,
        settle_seconds=args.settle,
    )
    if args.model:
        base = SETTINGS["demo"]
        chosen = [
            Setting(
                name="custom",
                model=args.model,
                batch_size=args.batch_size or base.batch_size,
                trials=args.trials or base.trials,
                hf_trials=args.hf_trials or base.hf_trials,
            )
        ]
    else:
        names = list(SETTINGS) if args.setting == "all" else [args.setting]
        chosen = [SETTINGS[name] for name in names]
        if args.batch_size or args.trials or args.hf_trials:
            chosen = [
                Setting(
                    name=s.name,
                    model=s.model,
                    batch_size=args.batch_size or s.batch_size,
                    trials=args.trials or s.trials,
                    hf_trials=args.hf_trials or s.hf_trials,
                    design=s.design,
                )
                for s in chosen
            ]
    print(f"throughput benchmark, {date.today()}, {os.cpu_count()} CPUs, {load_average()}", flush=True)
    init_ray(settings)
    with tempfile.TemporaryDirectory() as tmp:
        for setting in chosen:
            bench(setting, options=options, settings=settings, workdir=Path(tmp))


if __name__ == "__main__":
    main()
