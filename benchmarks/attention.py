"""Attention benchmark: where a real Gemma 3 looks when it answers question k, in its sliding and its global
layers, as the question moves away from its answer; with filler, with every layer made global
(`global-only`), and with a position gap (RoPE distance moved, tokens and window not).

    python benchmarks/attention.py --model /path/to/gemma-3-270m-q4_k_m.gguf      # ~10 min on 2 cores
    python benchmarks/attention.py --model /path/to/model --batch-sizes 10 --trials 2

Every configuration answers the same MMLU trials (constrained answers, gold sheet teacher-forced) on the
`hf` engine (`workers/hf_engine.py`): one forward pass per trial, attention reduced on the fly. Printed per
configuration and layer kind: own-question attention (head mean, and the largest head) by token-distance
bin, the mass beyond the window, and per configuration the time and memory per trial. The position gap is
compared paired with the baseline on the same trials: the change of own-question attention in the global
layers, and in the sliding ones (where it must be nothing the mask decides: the window is in tokens).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbias.schemas import AttentionRow, JobSpec, LayerKind, ShardResult, WorkerConfig
from posbias.service.settings import Settings
from posbias.service.work import submission
from posbias.service.work.shards import shard_spec
from posbias.workers.hf_engine import HfEngine

BINS = (0, 256, 512, 1024, 2048, 4096, 1 << 30)
"""Token-distance bin edges: the 270M model's window is 512 tokens."""


@dataclass(frozen=True)
class Config:
    """One configuration of the benchmark."""

    name: str
    variant: str = "baseline"
    filler: int = 0
    gap: int | None = None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A .gguf file, a model folder or a hub id.")
    parser.add_argument("--batch-sizes", default="10,20", help="Comma-separated N.")
    parser.add_argument("--trials", type=int, default=3, help="Trials per batch size.")
    parser.add_argument("--filler", type=int, default=600, help="Filler tokens before the answer request.")
    parser.add_argument("--gap", type=int, default=4096, help="Position gap after the last question.")
    parser.add_argument("--mmlu-dir", type=Path, default=None, help="The local MMLU copy (else settings).")
    parser.add_argument("--cache-dir", type=Path, default=None, help="Where the GGUF file is converted.")
    parser.add_argument(
        "--configs",
        default="baseline,filler,global-only,global-only-filler,gap",
        help="Which configurations, comma-separated (the gap's effect needs baseline and gap).",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    cache = args.cache_dir or Path(tempfile.gettempdir()) / "posbias-attention-bench"
    settings = Settings(cache_dir=cache, **({"mmlu_dir": args.mmlu_dir} if args.mmlu_dir else {}))
    sizes = tuple(int(n) for n in args.batch_sizes.split(","))
    configs = [
        Config("baseline"),
        Config(f"filler {args.filler}", filler=args.filler),
        Config("global-only", variant="global-only"),
        Config(f"global-only, filler {args.filler}", variant="global-only", filler=args.filler),
        Config(f"position gap {args.gap}", gap=args.gap),
    ]
    keys = ["baseline", "filler", "global-only", "global-only-filler", "gap"]
    chosen = set(args.configs.split(","))
    configs = [config for key, config in zip(keys, configs, strict=True) if key in chosen]
    outcomes: dict[str, list[ShardResult]] = {}
    for config in configs:
        results, seconds, engine_facts = run(
            config, model=args.model, sizes=sizes, trials=args.trials, settings=settings
        )
        outcomes[config.name] = results
        report(config, results, seconds=seconds, facts=engine_facts)
        sys.stdout.flush()
    if "baseline" in outcomes and f"position gap {args.gap}" in outcomes:
        gap_effect(outcomes["baseline"], outcomes[f"position gap {args.gap}"], gap=args.gap)


def run(
    config: Config, *, model: str, sizes: Sequence[int], trials: int, settings: Settings
) -> tuple[list[ShardResult], float, dict[str, Any]]:
    """The configuration's trials on a fresh `hf` engine: their results, the seconds of scoring, facts."""
    fields: dict[str, Any] = {
        "model": model,
        "batch_sizes": list(sizes),
        "iterations": trials,
        "shard_size": trials,
        "seed": 26,
        "answer_mode": "constrained",
        "engine": {"name": "hf", **({"position_gap": config.gap} if config.gap else {})},
        "variants": [config.variant],
    }
    if config.filler:
        fields["filler"] = {"tokens": [config.filler], "where": "end"}
    prepared = submission.prepare(JobSpec.model_validate(fields), settings=settings)
    spec, plan = prepared.spec, prepared.plan
    shards = [
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
    started = time.perf_counter()
    engine = HfEngine(
        model,
        options=spec.engine,
        variant=spec.runs[0],
        config=WorkerConfig(cache_dir=str(settings.cache_dir)),
    )
    load = time.perf_counter() - started
    try:
        started = time.perf_counter()
        results = engine.run_shards(shards)
        seconds = time.perf_counter() - started
        layers = engine.model_info.layers
        facts = {
            "load_seconds": load,
            "layers": layers.describe() if layers is not None else "?",
            "canary": engine.canary.passed,
            "gap_safe": engine.canary.position_gap_safe,
        }
    finally:
        engine.close()
    return results, seconds, facts


def binned(rows: Sequence[AttentionRow]) -> dict[tuple[LayerKind, int], list[AttentionRow]]:
    """Rows by (layer kind, token-distance bin index)."""
    found: dict[tuple[LayerKind, int], list[AttentionRow]] = defaultdict(list)
    for row in rows:
        if row.token_distance is None:
            continue
        index = next(i for i in range(len(BINS) - 1) if BINS[i] <= row.token_distance < BINS[i + 1])
        found[(row.layer_kind, index)].append(row)
    return found


def report(config: Config, results: Sequence[ShardResult], *, seconds: float, facts: dict[str, Any]) -> None:
    rows = [row for result in results if result.attention for row in result.attention.rows]
    trials = sum(1 for result in results for t in result.trials if t.status == "done")
    prompt = statistics.mean(t.prompt_tokens or 0 for result in results for t in result.trials)
    attention = [result.attention for result in results if result.attention is not None]
    state = max(a.state_bytes_per_trial for a in attention)
    maps = max(a.map_bytes_peak for a in attention)
    peak = max(a.peak_memory_bytes or 0 for a in attention)
    print(f"\n## {config.name}: {facts['layers']}; canary passed: {facts['canary']}")
    print(
        f"{trials} trials, mean prompt {prompt:.0f} tokens; {seconds / max(trials, 1):.2f} s per trial "
        f"(load {facts['load_seconds']:.1f} s); state {state / 1024:.1f} KiB per trial, largest one-layer "
        f"map {maps / 2**20:.1f} MiB, peak RSS {peak / 2**30:.2f} GiB"
        + (f"; position gap safe: {facts['gap_safe']}" if facts["gap_safe"] is not None else "")
    )
    print("| layers | token distance | rows | own (head mean) | own (largest head) | beyond window |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (kind, index), group in sorted(binned(rows).items(), key=lambda item: (item[0][0].value, item[0][1])):
        upper = "inf" if BINS[index + 1] >= 1 << 30 else str(BINS[index + 1])
        beyond = [r.beyond_window_mean for r in group if r.beyond_window_mean is not None]
        print(
            f"| {kind.value} | {BINS[index]}-{upper} | {len(group)} | "
            f"{statistics.mean(r.own_mean for r in group):.4f} | "
            f"{statistics.mean(r.own_max for r in group):.4f} | "
            f"{statistics.mean(beyond) if beyond else float('nan'):.4f} |"
        )


def gap_effect(baseline: Sequence[ShardResult], gapped: Sequence[ShardResult], *, gap: int) -> None:
    """Own-question attention with the gap minus without, paired by (trial, position, layer)."""

    def by_key(results: Sequence[ShardResult]) -> dict[tuple[int, int, int], AttentionRow]:
        return {
            (r.trial_index, r.position, r.layer): r
            for res in results
            if res.attention
            for r in res.attention.rows
        }

    a, b = by_key(baseline), by_key(gapped)
    print(f"\n## position gap {gap}: own-question attention, gap minus none (paired, same trials)")
    print("| layers | token distance | pairs | without | with gap | difference |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    grouped = binned([a[key] for key in a if key in b])
    for (kind, index), group in sorted(grouped.items(), key=lambda item: (item[0][0].value, item[0][1])):
        keys = [(r.trial_index, r.position, r.layer) for r in group]
        before = statistics.mean(a[k].own_mean for k in keys)
        after = statistics.mean(b[k].own_mean for k in keys)
        upper = "inf" if BINS[index + 1] >= 1 << 30 else str(BINS[index + 1])
        print(
            f"| {kind.value} | {BINS[index]}-{upper} | {len(keys)} | {before:.4f} | {after:.4f} | "
            f"{after - before:+.4f} |"
        )
    probs_a = [r.gold_prob for res in baseline for r in res.results if r.gold_prob is not None]
    probs_b = [r.gold_prob for res in gapped for r in res.results if r.gold_prob is not None]
    if probs_a and probs_b:
        print(
            f"mean p(gold): {statistics.mean(probs_a):.4f} without, "
            f"{statistics.mean(probs_b):.4f} with the gap"
        )


if __name__ == "__main__":
    main()
