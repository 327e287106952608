"""Attention memory benchmark: one hf job's attention at 8k and 32k tokens, from the answer rows (the engine's
way: `workers/hf_attention.py`) against transformers' eager attention with every layer's whole map (the
engine's way before), side by side: time, peak memory, the largest map held, and whether they agree.

    python -u benchmarks/attention_memory.py                       # 8k and 32k tokens
    python -u benchmarks/attention_memory.py --tokens 2048,8192    # a quick look

The model: a tiny random Gemma 2 with a 32k context (`tests/support/attention_memory.py`: four layers, a
4096-token window on two, two heads of 32, logit softcapping), built once into the test cache. The job: one
trial of `--batch-size` MMLU questions (`POSBIAS_MMLU_DIR`), filler before the answer request up to the
length, constrained answers, the gold sheet teacher-forced: one forward pass on the CPU in float32.

Each pass runs in a process of its own, one after the other: its peak resident set above what the process
held before the pass (the loaded model; sampled every 2 ms), and the process's whole peak (`ru_maxrss`: the
load and the mask canary, 12,288 tokens for the 4096-token window, included). Eager runs only where it
fits: its peak is predicted from its smallest measured run (it grows with the square of the length) or,
before any, from one layer's map, and a pass predicted above `--share` of the memory available now is not
started (it would take a shared machine down): the table says so. About 9 minutes on 2 loaded cores, most of
it the four loads' mask canaries.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.attention_memory import (
    LONG_CONTEXT,
    Pass,
    differences,
    job_shards,
    long_model_fields,
    measure,
    mib,
)
from support.tinymodels import tiny_model

from posbias.schemas import EngineOptions, WorkerConfig
from posbias.service.settings import Settings
from posbias.workers.hf_engine import HfEngine

HEADS = 2
"""The tiny model's heads (`long_model_fields`)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tokens", default=f"8192,{LONG_CONTEXT}", help="Comma-separated job lengths.")
    parser.add_argument("--batch-size", type=int, default=20, help="Questions in the trial (N).")
    parser.add_argument("--share", type=float, default=0.6, help="Of available memory eager may take.")
    parser.add_argument("--mmlu-dir", type=Path, default=None, help="The local MMLU copy (else settings).")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # MODE,TOKENS: one pass, as JSON
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(**({"mmlu_dir": args.mmlu_dir} if args.mmlu_dir else {}))


def one_pass(args: argparse.Namespace, model: Path) -> None:
    """The child: load the engine, run the job once in the mode asked, print the pass as JSON."""
    mode, tokens = args.one.split(",")
    settings = settings_of(args)
    engine = HfEngine(
        str(model),
        options=EngineOptions(name="hf"),
        config=WorkerConfig(cache_dir=str(settings.cache_dir)),
        device="cpu",
    )
    try:
        shards = job_shards(
            engine, model=str(model), tokens=int(tokens), batch_size=args.batch_size, settings=settings
        )
        found = measure(engine, shards, mode=mode, device="cpu")
    finally:
        engine.close()
    found.process_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps(found.to_json()))


def run_child(args: argparse.Namespace, *, mode: str, tokens: int) -> Pass:
    command = [
        sys.executable,
        "-u",
        __file__,
        "--one",
        f"{mode},{tokens}",
        "--batch-size",
        str(args.batch_size),
    ]
    if args.mmlu_dir:
        command += ["--mmlu-dir", str(args.mmlu_dir)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {mode} pass at {tokens} tokens failed:\n{done.stderr[-3000:]}")
    return Pass.from_json(json.loads(done.stdout.strip().splitlines()[-1]))


def available() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    model = tiny_model(**long_model_fields())
    if args.one:
        one_pass(args, model)
        return
    sizes = [int(n) for n in args.tokens.split(",")]
    print(
        f"tiny Gemma 2, 32k context ({model.name}); N = {args.batch_size}; CPU, float32, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print("| tokens | pass | seconds | peak above start | process peak | largest map held | note |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    measured: dict[tuple[str, int], Pass] = {}
    eager_seen: tuple[int, int] | None = None  # (tokens, peak) of the smallest eager pass run
    for tokens in sizes:
        rows = run_child(args, mode="rows", tokens=tokens)
        measured[("rows", tokens)] = rows
        print(
            f"| {rows.tokens:,} | answer rows | {rows.seconds:.1f} | {mib(rows.peak_bytes)} | "
            f"{mib(rows.process_bytes)} | {mib(rows.map_bytes)} | |"
        )
        if eager_seen is None:
            predicted = 2 * HEADS * tokens**2 * 4  # one layer's map and its softmax, at the least
        else:
            predicted = int(eager_seen[1] * (tokens / eager_seen[0]) ** 2)
        room = available()
        if predicted > args.share * room:
            why = f"does not fit: {args.share:.0%} of the {mib(room)} available is {mib(args.share * room)}"
            one_map = mib(HEADS * tokens**2 * 4)
            print(f"| {tokens:,} | eager | not run | {mib(predicted)} predicted | | {one_map} | {why} |")
            continue
        full = run_child(args, mode="eager", tokens=tokens)
        measured[("eager", tokens)] = full
        eager_seen = eager_seen or (tokens, full.peak_bytes)
        masses, probs = differences(rows, full)
        agree = f"agree: masses within {masses:.1e}, option probabilities within {probs:.1e}"
        cost = (
            f"{full.seconds:.1f} | {mib(full.peak_bytes)} | {mib(full.process_bytes)} | {mib(full.map_bytes)}"
        )
        print(f"| {full.tokens:,} | eager | {cost} | {agree} |")
    print()
    for tokens in sizes:
        rows, full = measured[("rows", tokens)], measured.get(("eager", tokens))
        if full is None:
            continue
        print(
            f"{tokens:,} tokens: eager/rows time {full.seconds / rows.seconds:.2f}, peak memory "
            f"{full.peak_bytes / max(rows.peak_bytes, 1):.1f}, largest map "
            f"{full.map_bytes / rows.map_bytes:.0f}"
        )
    if len(sizes) > 1:
        small, large = measured[("rows", sizes[0])], measured[("rows", sizes[-1])]
        time_ratio = large.seconds / small.seconds
        peak_ratio = large.peak_bytes / max(small.peak_bytes, 1)
        print(
            f"answer rows, {sizes[-1]:,} against {sizes[0]:,} tokens: time {time_ratio:.1f}, peak memory "
            f"{peak_ratio:.1f}, largest map {large.map_bytes / small.map_bytes:.1f} "
            f"(length {sizes[-1] / sizes[0]:.0f}x)"
        )


if __name__ == "__main__":
    main()
