"""How often `posbias diagnose` implicates the true suspect, and a wrong one, by simulation (issue 41).

Each replication plans the battery with the real `plan_battery` for a fake model (`FakeSpec` with a
`FakeMechanism`, and an option prior for the collapse), simulates the answers of its jobs with the fake
engine's own rule (`FakeSpec.accuracy_of` for each answer's accuracy, `latent_correct` for its correctness,
the fake's option probabilities and prior for the option it writes), runs the analyses that
`service/diagnose/suspects.py`'s `gather` runs through `service/reports/curves.py` (`explain_curve` of the
behaviour job, options by position, `comparison.compare` of each variant with the baseline, paired), and
calls the real `judge`. The engine and the store are left out, as in benchmarks/coverage.py, whose
simulation pieces (the planner's layout and the worker's token distances, `design_layout`; the latent
parts, `World`; answers by the fake's rule, `design_answers`) this program imports.

Variants answer the same trials as the baseline with the same question and prompt latents and the same
noise: the fake engine seeds an answer's noise from the job's seed and the prompt's tokens, which a variant
does not change, so a variant's answer differs from the baseline's only where its accuracy does.

    python benchmarks/diagnose_coverage.py --reps 200               # every setting
    python benchmarks/diagnose_coverage.py --reps 50 --only 'window*,none*'
    python benchmarks/diagnose_coverage.py --list

Prints, per setting and suspect, how often it was implicated, ruled out and left at cannot tell, with the
implicated rate's binomial 95% interval and its target (>= 0.90 for a true suspect, <= 0.05 for a wrong
one). Figures and the command are in benchmarks/README.md ("Diagnose").
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from coverage import LENGTHS, Tally, World, design_answers, design_layout

from posbias.schemas import FakeSpec, JobSpec
from posbias.schemas.diagnosis import Call, Diagnosis, Line, Suspect
from posbias.service.diagnose.battery import plan_battery
from posbias.service.diagnose.suspects import Evidence, judge
from posbias.service.stats import comparison
from posbias.service.stats import options as option_views
from posbias.service.stats.explain import explain_curve
from posbias.service.stats.trial_data import TrialData
from posbias.workers.fake_engine import fake_model_info, option_probs, with_prior

OPTIONS = 4
"""Options per question (MMLU's)."""
BREAK_RESAMPLES = 100
"""Bootstrap resamples for the step's location (gather's default is 1,000): the location is printed in a
finding's reason and decides no call, so fewer keep a replication fast."""


@dataclass
class Case:
    """One simulated model: its fake (window, mechanism, option prior), the suspects that truly act, the
    battery's budget and the question lengths."""

    name: str
    about: str
    fake: dict[str, Any]
    truth: frozenset[Suspect]
    budget: int = 1500
    lengths: str = "mmlu"
    tallies: dict[str, Tally] = field(default_factory=dict)


def simulate(case: Case, rep: int, rng: np.random.Generator) -> Diagnosis:
    """One diagnosis of `case`'s fake: the battery planned, its jobs answered, the evidence judged."""
    fake = FakeSpec.model_validate(case.fake)
    facts = fake_model_info(fake, model=f"fake/{case.name}")
    battery = plan_battery(facts, engine="fake", budget=case.budget, fake=fake, seed=rep)
    job_ids = {job.key: number for number, job in enumerate(battery.jobs, start=1)}
    lengths = LENGTHS[case.lengths](rng)
    questions = World.draw(rng, prompts=1).questions  # difficulty: one per question, in every job
    by_line = {job.line: job for job in battery.jobs}
    behaviour = _answers(by_line[Line.behaviour].spec, lengths, questions, rng=rng)
    data, options = behaviour[fake.model_dump_json()]
    explanation = explain_curve(
        data, model=facts.name, info=facts, resamples=BREAK_RESAMPLES, seed=rep, design="simulated"
    )
    view = option_views.view(options, model=facts.name, job_ids=(job_ids[by_line[Line.behaviour].key],))
    compared = {}
    intervention = by_line.get(Line.intervention)
    if intervention is not None:
        spec = intervention.spec
        answered = _answers(spec, lengths, questions, rng=rng)
        runs = {v.name: answered[spec.fake_for(v).model_dump_json()][0] for v in spec.runs}
        base = runs[spec.names[0]]
        for name in spec.names[1:]:
            compared[name] = comparison.compare(base, runs[name], labels=(spec.names[0], name))
    return judge(battery, Evidence(explanation=explanation, options=view, compared=compared), job_ids)


def _answers(
    spec: JobSpec, lengths: np.ndarray, questions: np.ndarray, *, rng: np.random.Generator
) -> Mapping[str, tuple[TrialData, option_views.OptionData]]:
    """Each distinct fake of `spec`'s variants answering the job's trials (laid out as the planner does):
    its `TrialData` and its options, by the fake's JSON. One noise draw for all of them (the fake's seed and
    the prompt's tokens decide it, not the variant)."""
    filler = spec.filler.tokens if spec.filler is not None else (0,)
    layout = design_layout(
        n=spec.batch_sizes[0],
        iterations=spec.iterations,
        lengths=lengths,
        rng=rng,
        order=str(spec.answer_order),
        filler=tuple(filler),
        where=str(spec.filler.where) if spec.filler is not None else "end",
    )
    world = World(questions=questions, prompts=rng.standard_normal(spec.iterations))
    state = rng.bit_generator.state
    gold = rng.integers(0, OPTIONS, size=layout.questions.shape)
    wrong = rng.integers(1, OPTIONS, size=layout.questions.shape)  # which other option a wrong answer takes
    found: dict[str, tuple[TrialData, option_views.OptionData]] = {}
    for variant in spec.runs:
        fake = spec.fake_for(variant)
        key = fake.model_dump_json()
        if key in found:
            continue
        noise = np.random.default_rng(0)
        noise.bit_generator.state = state  # the same noise for every variant
        data = design_answers(fake, layout, world, rng=noise)
        found[key] = _with_options(fake, data, layout.distance, gold=gold, wrong=wrong)
    rng.bit_generator.state = state
    rng.random()  # move on from the shared draw
    return found


def _with_options(
    fake: FakeSpec, data: TrialData, distance: np.ndarray, *, gold: np.ndarray, wrong: np.ndarray
) -> tuple[TrialData, option_views.OptionData]:
    """The option each answer writes, as the fake engine chooses it: the gold one when correct, another
    otherwise; where the option prior applies, the most probable option of its probabilities times the prior
    (`with_prior`), so a strong prior writes the favoured option whatever the answer. The data's correctness
    follows the option written."""
    trials, n = data.correct.shape
    right = data.correct > 0
    predicted = np.where(right, gold, (gold + wrong) % OPTIONS)
    probs = np.full((trials, n, OPTIONS), np.nan)
    position = np.arange(1, n + 1)
    slot = (
        np.nan_to_num(data.slot, nan=1.0) if data.slot is not None else np.broadcast_to(position, (trials, n))
    )
    lines = data.lines if data.lines is not None else np.full(trials, float(n))
    accuracy = fake.accuracy_of(
        position=np.broadcast_to(position, (trials, n)),
        batch_size=n,
        slot=slot,
        answers=int(lines[0]),
        distance=np.nan_to_num(distance),
    )
    accuracy = np.broadcast_to(np.asarray(accuracy, dtype=np.float64), (trials, n))
    collapse = fake.collapse
    prior = collapse.weights(OPTIONS) if collapse is not None else None
    for t in range(trials):
        for j in range(n):
            if data.answered[t, j] <= 0:
                continue
            p = option_probs(
                OPTIONS, chosen=int(predicted[t, j]), gold=int(gold[t, j]), accuracy=accuracy[t, j]
            )
            if prior is not None and collapse is not None and collapse.applies(j + 1):
                p = with_prior(p, prior)
                predicted[t, j] = int(np.argmax(p))
            probs[t, j] = p
    answered = data.answered > 0
    correct = np.where(answered, (predicted == gold).astype(np.float64), 0.0)
    options = option_views.OptionData(
        batch_size=n,
        gold=np.where(answered, gold, -1),
        predicted=np.where(answered, predicted, -1),
        probs=probs,
        shuffled=np.zeros(trials, dtype=bool),  # the battery's jobs do not shuffle options
        cluster=data.cluster,
    )
    return replace(data, correct=correct), options


def tally(case: Case, diagnosis: Diagnosis) -> None:
    """Count each suspect's verdict against the truth."""
    for verdict in diagnosis.suspects:
        true = verdict.suspect in case.truth
        what = "true" if true else "wrong"
        tallies = case.tallies
        tallies.setdefault(
            f"{verdict.suspect.value} ({what}): implicated", Tally(">= 0.90" if true else "<= 0.05")
        )
        tallies.setdefault(f"{verdict.suspect.value} ({what}): ruled out", Tally(""))
        tallies.setdefault(f"{verdict.suspect.value} ({what}): cannot tell", Tally(""))
        tallies[f"{verdict.suspect.value} ({what}): implicated"].add(verdict.call is Call.implicated)
        tallies[f"{verdict.suspect.value} ({what}): ruled out"].add(verdict.call is Call.ruled_out)
        tallies[f"{verdict.suspect.value} ({what}): cannot tell"].add(verdict.call is Call.cannot_tell)
    for verdict in diagnosis.suspects:
        if verdict.suspect is Suspect.position:  # how: explain names it, or the lines leave only it
            what = "true" if verdict.suspect in case.truth else "wrong"
            eliminated = verdict.call is Call.implicated and verdict.findings[0].reason.startswith(
                "position and token distance together"
            )
            case.tallies.setdefault(
                f"position ({what}): implicated as the group's only suspect", Tally("")
            ).add(eliminated)
        for line in (Line.behaviour, Line.intervention):
            calls = [f.call for f in verdict.findings if f.line is line]
            if not calls or calls[0] is Call.not_tested:
                continue
            true = verdict.suspect in case.truth
            key = f"{verdict.suspect.value} ({'true' if true else 'wrong'}): {line.value} line implicates"
            case.tallies.setdefault(key, Tally("")).add(calls[0] is Call.implicated)


def _mechanism(**fields: float) -> dict[str, Any]:
    return {"accuracy": 0.7, **fields}


CASES = [
    Case(
        "none",
        "no mechanism (flat 70%), window 1,500",
        {"window": 1500, "mechanism": _mechanism()},
        frozenset(),
    ),
    Case(
        "window",
        "a 20-point step at a 1,500-token window",
        {"window": 1500, "mechanism": _mechanism(window_step=0.2)},
        frozenset({Suspect.window}),
    ),
    Case(
        "window-600",
        "a 25-point step at a 600-token window, budget 1,000",
        {"window": 600, "mechanism": _mechanism(window_step=0.25)},
        frozenset({Suspect.window}),
        budget=1000,
    ),
    Case(
        "rope",
        "a RoPE decay, 30 points by 3,000 tokens, window 2,500",
        {"window": 2500, "mechanism": _mechanism(rope_decay=0.3, rope_span=3000)},
        frozenset({Suspect.rope}),
    ),
    Case(
        "slot",
        "answer slot: 25 points lost on the first line, window 1,500",
        {"window": 1500, "mechanism": _mechanism(slot_drop=0.25)},
        frozenset({Suspect.slot}),
    ),
    Case(
        "position",
        "position as such: 25 points lost at position 1, window 1,500",
        {"window": 1500, "mechanism": _mechanism(position_drop=0.25)},
        frozenset({Suspect.position}),
    ),
    Case(
        "collapse",
        "positions 1-3 collapse onto option 2 (prior 0.9), window 1,500",
        {
            "window": 1500,
            "mechanism": _mechanism(),
            "collapse": {"option": 2, "positions": [1, 3], "prior": 0.9},
        },
        frozenset({Suspect.collapse}),
    ),
    Case(
        "window+rope",
        "two causes: a 20-point step at 1,500 and a RoPE decay of 25 points by 3,000 tokens",
        {"window": 1500, "mechanism": _mechanism(window_step=0.2, rope_decay=0.25, rope_span=3000)},
        frozenset({Suspect.window, Suspect.rope}),
    ),
    Case(
        "none-wide",
        "no mechanism, window 800, widely varying question lengths, budget 1,000",
        {"window": 800, "mechanism": _mechanism()},
        frozenset(),
        budget=1000,
        lengths="wide",
    ),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=200, help="Replications per setting (default 200).")
    parser.add_argument("--only", help="Comma-separated setting names or patterns (default: all; --list).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the simulation.")
    parser.add_argument("--list", action="store_true", help="List the settings and exit.")
    args = parser.parse_args(argv)
    if args.list:
        for case in CASES:
            print(f"{case.name:14} {case.about}")
        return 0
    names = [c.name for c in CASES]
    asked = args.only.split(",") if args.only else ["*"]
    unknown = [pattern for pattern in asked if not fnmatch.filter(names, pattern)]
    if unknown:
        print(f"unknown setting(s): {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
        return 2
    wanted = {name for pattern in asked for name in fnmatch.filter(names, pattern)}
    print(f"{args.reps} replications per setting, seed {args.seed}")
    print(f"{'setting':12} {'suspect: verdict':58} {'rate':>6} {'95% CI of rate':>14} {'target':>8}")
    for case in CASES:
        if case.name not in wanted:
            continue
        rng = np.random.default_rng([args.seed, sum(map(ord, case.name))])
        started = time.perf_counter()
        for rep in range(args.reps):
            tally(case, simulate(case, rep, rng))
            if (rep + 1) % max(1, args.reps // 10) == 0:
                print(
                    f"  {case.name}: {rep + 1}/{args.reps} ({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                )
        for name, counted in case.tallies.items():
            low, high = counted.interval()
            bounds = f"{low:.3f}-{high:.3f}"
            print(f"{case.name:12} {name:58} {counted.rate():6.3f} {bounds:>14} {counted.target:>8}")
        print(f"{'':12} ({case.about}; {time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
