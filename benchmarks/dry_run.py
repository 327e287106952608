"""What a dry run over many filler lengths costs, its prompts counted from their pieces (what `posbias submit
--dry-run` does now) against rendered and tokenized whole (what it did before, kept as the reference),
side by side in one run on the same plan; then the command itself, end to end.

    python benchmarks/dry_run.py                              # 10,000 trials, 5,000 filler lengths: ~1 min
    python benchmarks/dry_run.py --filler-lengths 500         # a quick look
    python benchmarks/dry_run.py --tokenizer tiny-bpe         # a model's kind of tokenizer (checked whole)

The job is the fake engine's: batch size 2, `--iterations` sets, each shown at filler lengths 0, 1, ...,
`--filler-lengths` - 1 at the end of the prompt (10,000 trials by default). The dry run counts one prompt per
batch size and filler length, 5,000 prompts. With `--tokenizer tiny-bpe` the prompts are counted with a tiny
trained byte-level BPE tokenizer (the tiny models'), which states no reach, so the new way also tokenizes
one prompt per batch size whole to check; it also times, both ways, what a vLLM job measures at submit to
choose its context (`service/work/context.longest_prompt`). Both ways must give the same results, or the
program says so and fails. Prints the seconds (wall and CPU) of each way, their ratio, and the command's
seconds to a pipe, as JSON and as the table, with the load average before and after (other work on a shared
machine moves them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posbias.schemas import DryRun, JobSpec
from posbias.service.settings import Settings
from posbias.service.work import submission


def spec_for(*, filler_lengths: int, iterations: int) -> dict[str, Any]:
    return {
        "model": "fake/many-fillers",
        "engine": {"name": "fake"},
        "batch_sizes": [2],
        "iterations": iterations,
        "filler": {"tokens": list(range(filler_lengths))},
    }


def timed(call: Callable[[], DryRun]) -> tuple[DryRun, float, float]:
    """The call's result, wall seconds and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    found = call()
    return found, time.perf_counter() - wall, time.process_time() - cpu


def command(args: list[str], *, folder: str) -> tuple[float, float]:
    """Wall and CPU seconds of `posbias ARGS` run to a pipe."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    ran = subprocess.run(
        [sys.executable, "-m", "posbias.cli", *args], cwd=folder, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    if ran.returncode != 0:
        raise SystemExit(f"posbias {' '.join(args)} failed: {ran.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filler-lengths", type=int, default=5000)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--tokenizer", choices=("fake", "tiny-bpe"), default="fake")
    options = parser.parse_args()
    settings = Settings()
    if settings.mmlu_dir is None:
        raise SystemExit("set POSBIAS_MMLU_DIR to a local MMLU copy")
    print(f"load average before: {load()}")
    raw = spec_for(filler_lengths=options.filler_lengths, iterations=options.iterations)
    spec = JobSpec.model_validate(raw)
    start = time.perf_counter()
    prepared = submission.prepare(spec, settings=settings)
    print(
        f"plan: {len(prepared.plan.trials):,} trials, {options.filler_lengths:,} filler lengths "
        f"(batch size 2, {options.iterations} sets), prepared in {time.perf_counter() - start:.2f} s"
    )
    if options.tokenizer == "tiny-bpe":
        from posbias.workers.tiny_models import _LLAMA_STYLE, _build_tokenizer
        from posbias.workers.tokenizer import HfTokenizer

        bpe = HfTokenizer(_build_tokenizer(_LLAMA_STYLE, vocab_size=512, seed=0))
        prepared = dataclasses.replace(prepared, tokenizer=bpe, tokenizer_source="a tiny byte-level BPE")
    pieces, pieces_wall, pieces_cpu = timed(lambda: submission.dry_run(prepared, settings=settings))
    whole, whole_wall, whole_cpu = timed(
        lambda: submission._dry_run(
            prepared, settings=settings, sample=submission.SAMPLE_TRIALS, on_progress=None, whole=True
        )
    )
    same = pieces.model_dump(exclude={"counting"}) == whole.model_dump(exclude={"counting"})
    print(f"counted with {pieces.tokenizer}: {pieces.counting}")
    print(f"{'way':<44} {'wall s':>8} {'cpu s':>8}")
    print(f"{'(w) each prompt rendered and tokenized whole':<44} {whole_wall:>8.2f} {whole_cpu:>8.2f}")
    print(f"{'(p) each prompt counted from its pieces':<44} {pieces_wall:>8.2f} {pieces_cpu:>8.2f}")
    print(f"w/p: {whole_wall / pieces_wall:.1f} (wall), {whole_cpu / pieces_cpu:.1f} (cpu)")
    print(f"the same dry run both ways: {'yes' if same else 'NO'}")
    if options.tokenizer == "tiny-bpe":
        same = longest_both_ways(prepared) and same
    if options.tokenizer == "fake":
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "spec.json").write_text(json.dumps(raw))
            print("the command, to a pipe (startup, planning, counting, printing):")
            for label, args in (
                ("posbias submit spec.json --dry-run --json", ["--json"]),
                ("posbias submit spec.json --dry-run", []),
            ):
                command(["submit", "spec.json", "--dry-run", *args], folder=folder)  # warm the file cache
                wall, cpu = command(["submit", "spec.json", "--dry-run", *args], folder=folder)
                print(f"  {label:<42} {wall:>8.2f} {cpu:>8.2f}")
    print(f"load average after: {load()}")
    if not same:
        raise SystemExit("the two ways gave different results")


def longest_both_ways(prepared: submission.Prepared) -> bool:
    """A vLLM job measures its longest prompt at submit (and in its dry run) to choose its context: each
    batch size and filler length's longest bound, measured on a prompt tokenized whole or counted from its
    pieces. Prints both ways' seconds; True when they find the same longest prompt."""
    from posbias.service.work import context

    spec, plan, tokenizer = prepared.spec, prepared.plan, prepared.tokenizer
    wall, cpu = time.perf_counter(), time.process_time()
    whole = context._longest(spec, plan, tokenizer=tokenizer, budget=None, on_progress=None, whole=True)
    whole_wall, whole_cpu = time.perf_counter() - wall, time.process_time() - cpu
    wall, cpu = time.perf_counter(), time.process_time()
    pieces = context.longest_prompt(spec, plan, tokenizer=tokenizer)
    pieces_wall, pieces_cpu = time.perf_counter() - wall, time.process_time() - cpu
    print("a vLLM job's longest prompt (its context length), one group per filler length:")
    print(f"  {'(w) measured on prompts tokenized whole':<42} {whole_wall:>8.2f} {whole_cpu:>8.2f}")
    print(f"  {'(p) measured on prompts counted from pieces':<42} {pieces_wall:>8.2f} {pieces_cpu:>8.2f}")
    print(f"  w/p: {whole_wall / pieces_wall:.1f} (wall), {whole_cpu / pieces_cpu:.1f} (cpu)")
    found = pieces == whole.longest
    print(f"  the same longest prompt both ways: {'yes' if found else 'NO'} ({pieces})")
    return found


def load() -> str:
    """The 1, 5 and 15 minute load averages, and the CPUs they are out of."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} CPUs)"


if __name__ == "__main__":
    main()
