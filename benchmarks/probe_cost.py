"""What the probe design costs: each sampled set asked at every position, N prompts a set, against the random
design's one prompt a set, on the same sets, side by side in one run.

    python benchmarks/probe_cost.py                          # the demo model, N = 10, 5 sets (8 min)
    python benchmarks/probe_cost.py --model demo --batch-size 20 --sets 10 --repeats 3

The probe's N prompts of one set differ only in their last line ("Answer question k only"), so an engine with
a prefix cache reads the shared questions once. Three ways over the same sets, each through raw vLLM as
`benchmarks/throughput.py`'s (a) runs it (posbias's prompts, token for token, in one `LLM.generate` call,
constrained answers):

(r) the random design: one prompt a set, its N answers;
(p) the probe design with vLLM's prefix cache on (vLLM's default, and posbias's);
(p0) the probe design with the prefix cache off.

Each way runs once untimed, then `--repeats` times in rotating order; the prefix cache is emptied before every
pass, so (p) gains only from the prompts of its own sets. Prints the medians and the ratios p/r and p0/r (time
for the same sets, N times the answers' prompts) and the prompt tokens each sent.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import REPO, Options, Run, Setting, job_spec, load_average, run_raw, start_raw_llm

from posbias.schemas import JobSpec
from posbias.service.settings import Settings
from posbias.service.work import submission


def spec_for(model: str, *, batch_size: int, sets: int, probe: bool, cache: bool) -> JobSpec:
    design: dict[str, Any] = {"design": "probe"} if probe else {}
    setting = Setting(
        name="probe", model=model, batch_size=batch_size, trials=sets, hf_trials=0, design=design
    )
    options = Options(
        repeats=1,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.4,
        max_model_len=None,
        database_url=None,
        skip_hf=True,
    )
    spec = job_spec(model, setting, options)
    if not cache:
        engine = spec.engine.model_copy(update={"extra": {"enable_prefix_caching": False}})
        spec = spec.model_copy(update={"engine": engine})
    return spec


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="demo", help="any model posbias accepts (default: demo)")
    parser.add_argument("--batch-size", type=int, default=10, help="questions per prompt (N)")
    parser.add_argument("--sets", type=int, default=5, help="sampled sets (iterations)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes of each way")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.WARNING)
    settings = Settings(mmlu_dir=Settings().mmlu_dir or REPO.parent / "shared" / "data" / "mmlu")
    print(f"probe cost, {date.today()}, {os.cpu_count()} CPUs, {load_average()}", flush=True)

    random_spec = spec_for(args.model, batch_size=args.batch_size, sets=args.sets, probe=False, cache=True)
    probe_spec = spec_for(args.model, batch_size=args.batch_size, sets=args.sets, probe=True, cache=True)
    no_cache = spec_for(args.model, batch_size=args.batch_size, sets=args.sets, probe=True, cache=False)
    plans = {
        "r": submission.prepare(random_spec, settings=settings).plan,
        "p": submission.prepare(probe_spec, settings=settings).plan,
    }
    assert {t.question_ids for t in plans["r"].trials} == {t.question_ids for t in plans["p"].trials}
    cached = start_raw_llm(random_spec, settings=settings)
    uncached = start_raw_llm(no_cache, settings=settings)
    ways: dict[str, tuple[JobSpec, Any]] = {
        "r": (random_spec, cached),
        "p": (probe_spec, cached),
        "p0": (probe_spec, uncached),
    }
    labels = {
        "r": "(r) random, one prompt a set",
        "p": "(p) probe, prefix cache on",
        "p0": "(p0) probe, prefix cache off",
    }

    def one_pass(name: str) -> Run:
        spec, llm = ways[name]
        plan = plans["p" if name.startswith("p") else "r"]
        llm.reset_prefix_cache()
        return run_raw(llm, spec, plan.trials, dict(plan.questions))

    print(
        f"   {args.model}, N = {args.batch_size}, {args.sets} sets: (r) {len(plans['r'].trials)} prompts, "
        f"(p) and (p0) {len(plans['p'].trials)}",
        flush=True,
    )
    for name in ways:
        one_pass(name)  # untimed: kernels and the CPU build's primitives are made on first use
    runs: dict[str, list[Run]] = {name: [] for name in ways}
    order = list(ways)
    for repeat in range(args.repeats):
        rotated = order[repeat % len(order) :] + order[: repeat % len(order)]
        for name in rotated:
            time.sleep(1.0)
            run = one_pass(name)
            runs[name].append(run)
            print(f"   repeat {repeat + 1} {labels[name]:32}{run.seconds:8.2f} s", flush=True)

    def median(name: str, pick: Callable[[Run], float]) -> float:
        return statistics.median(pick(r) for r in runs[name])

    print(f"\n   {'':32}{'seconds':>9}{'prompts':>9}{'prompt tokens':>15}{'answers':>9}")
    for name in ways:
        run = runs[name][0]
        answers = run.trials * (args.batch_size if name == "r" else 1)
        print(
            f"   {labels[name]:32}{median(name, lambda r: r.seconds):9.2f}{run.trials:9}"
            f"{run.prompt_tokens:15,}{answers:9}"
        )
    r = median("r", lambda run: run.seconds)
    for name in ("p", "p0"):
        ratios = [a.seconds / b.seconds for a, b in zip(runs[name], runs["r"], strict=True)]
        print(
            f"   {name}/r (time for the same sets): {statistics.median(ratios):.2f} "
            f"(per repeat: {', '.join(f'{x:.2f}' for x in ratios)})"
        )
    p, p0 = median("p", lambda run: run.seconds), median("p0", lambda run: run.seconds)
    print(f"   p0/p (what the prefix cache saves): {p0 / p:.2f}; medians r {r:.2f} s")
    print(f"   {load_average()}", flush=True)
    for llm in (cached, uncached):
        llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
