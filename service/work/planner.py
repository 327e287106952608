"""Turning a job spec into trials and shards, deterministically from its seed.

The same spec and question pool give the same plan on any machine: sampling uses numpy's `default_rng`
(PCG64, platform independent) seeded by the job seed and the batch size, and draws indices into the pool
sorted by question id, so neither load order nor the other batch sizes of the job change a batch size's
trials. Option shuffling and random answer orders each draw from a stream of their own, so turning either on
keeps the same questions: a job of the reverse or random order, or with filler, shows
the same sets as the seed's design with the same seed, and can be pooled with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from posbias.schemas import BASELINE, AnswerOrder, Design, JobSpec, Plan, PlannedShard, QuestionPool, Trial
from posbias.service.work.datasets import check_pool

QUESTIONS_PER_SHARD = 500
"""Default shard size in questions: the unit of leasing and of retry. About 500 questions (10 prompts at N =
50, 500 at N = 1) keeps a lost lease cheap (minutes, not hours); an actor answers up to
`service.dispatch.pools.SHARDS_PER_CALL` shards of one model in one engine call, so small shards still batch
well."""

PROGRESS_EVERY = 10_000
"""Trials between two progress calls of `plan`."""

_SAMPLE_STREAM = 0
_SHUFFLE_STREAM = 1
_ORDER_STREAM = 2


def plan(spec: JobSpec, *, pool: QuestionPool, on_progress: Callable[[int, int], None] | None = None) -> Plan:
    """All trials of `spec`, grouped into shards, with the questions they use.

    Trial indices run 0..T-1 over the batch sizes in ascending order. `random` samples N distinct
    questions per iteration; `rotation` samples N per iteration and shows them N times, rotated so every
    question sits at every position once; `probe` samples N per iteration and shows that one prompt N
    times, asking for a different position each time (the N prompts share everything before the request, so
    an engine with a prefix cache reads the questions once). Each sampled set (and rotation, and probe) is
    shown once per filler length, with the same options and answer order at every length, so
    only the filler differs between them. A random answer order is drawn per sampled set (and rotation).
    Each shard holds trials of one batch size. A job with several variants has these trials once per variant
    (`per_variant`). Raises `PosbiasError` when a batch size exceeds the pool. `on_progress(trials planned,
    total)` is called every `PROGRESS_EVERY` trials, and once at the end.
    """
    # One variant's trials: the other variants' are copies of them.
    total = sum(spec.trials_per_batch_size(n) for n in spec.batch_sizes)
    reported = 0
    check_pool(spec, pool=pool)
    ordered = sorted(pool.questions, key=lambda question: question.id)
    ids = [question.id for question in ordered]
    n_choices = [len(question.choices) for question in ordered]

    trials: list[Trial] = []
    shards: list[PlannedShard] = []
    used: set[int] = set()  # indices into `ids` of the questions some trial shows
    for batch_size in spec.batch_sizes:
        sample = np.random.default_rng(_entropy(spec.seed, batch_size, _SAMPLE_STREAM))
        shuffle = np.random.default_rng(_entropy(spec.seed, batch_size, _SHUFFLE_STREAM))
        ordering = np.random.default_rng(_entropy(spec.seed, batch_size, _ORDER_STREAM))
        first = len(trials)
        # A probe asks each position of a set in turn, the prompt otherwise the same; other designs ask all.
        probes: list[int | None] = list(range(1, batch_size + 1)) if spec.design is Design.probe else [None]
        for iteration in range(spec.iterations):
            chosen = sample.choice(len(ids), size=batch_size, replace=False).tolist()
            used.update(chosen)
            rotations = range(batch_size) if spec.design is Design.rotation else range(1)
            for rotation in rotations:
                # Position i holds chosen[(i + rotation) mod N]; list slices, not np.roll: a million
                # rotated trials are planned in seconds, not minutes.
                shown = chosen[rotation:] + chosen[:rotation]
                question_ids = tuple([ids[k] for k in shown])
                orders = (
                    tuple(tuple(int(j) for j in shuffle.permutation(n_choices[k])) for k in shown)
                    if spec.shuffle_choices
                    else None
                )
                answer_order = _answer_order(spec.answer_order, batch_size, rng=ordering)
                for probe, filler_tokens in itertools.product(probes, spec.filler_lengths):
                    trials.append(
                        Trial(
                            index=len(trials),
                            batch_size=batch_size,
                            iteration=iteration,
                            question_ids=question_ids,
                            choice_orders=orders,
                            rotation=rotation,
                            answer_order=answer_order,
                            probe=probe,
                            filler_tokens=filler_tokens,
                        )
                    )
            if on_progress is not None and len(trials) - reported >= PROGRESS_EVERY:
                reported = len(trials)
                on_progress(reported, total)
            if spec.limit is not None and len(trials) - first >= spec.limit:  # a quick look: the first trials
                del trials[first + spec.limit :]
                break
        size = shard_size(spec, batch_size=batch_size)
        for start in range(first, len(trials), size):
            stop = min(start + size, len(trials))
            shards.append(PlannedShard(index=len(shards), trial_indices=tuple(range(start, stop))))

    if on_progress is not None:
        on_progress(len(trials), total)
    by_id = {question.id: question for question in ordered}
    questions = {ids[k]: by_id[ids[k]] for k in sorted(used, key=lambda k: ids[k])}
    one = Plan(trials=tuple(trials), shards=tuple(shards), questions=questions)
    return per_variant(one, variants=[variant.name for variant in spec.runs])


def per_variant(plan: Plan, *, variants: Sequence[str]) -> Plan:
    """`plan` once for each of `variants`, in order: every variant answers the same trials (so comparisons
    between them are paired), in shards of its own (so each runs on its own engine). The k-th variant's
    trials and shards follow the previous variants', with their indices shifted."""
    if list(variants) == [BASELINE]:
        return plan
    trials: list[Trial] = []
    shards: list[PlannedShard] = []
    for name in variants:
        offset = len(trials)
        shards += [
            PlannedShard(
                index=len(shards) + k,
                trial_indices=tuple(offset + i for i in shard.trial_indices),
                variant=name,
            )
            for k, shard in enumerate(plan.shards)
        ]
        trials += [t.model_copy(update={"index": offset + t.index, "variant": name}) for t in plan.trials]
    return plan.model_copy(update={"trials": tuple(trials), "shards": tuple(shards)})


def _answer_order(order: AnswerOrder, batch_size: int, *, rng: np.random.Generator) -> tuple[int, ...] | None:
    """The positions in the order their answers are asked; None for forward order."""
    if order is AnswerOrder.forward or batch_size == 1:
        return None
    if order is AnswerOrder.reverse:
        return tuple(range(batch_size, 0, -1))
    return tuple(int(p) + 1 for p in rng.permutation(batch_size))


def shard_size(spec: JobSpec, *, batch_size: int) -> int:
    """Trials per shard at `batch_size`: `spec.shard_size`, or about `QUESTIONS_PER_SHARD` questions. A
    probe's shard holds whole sets (its N prompts a set at every filler length), so that one engine call
    sees the prompts that share a prefix."""
    size = spec.shard_size or max(1, QUESTIONS_PER_SHARD // batch_size)
    if spec.shard_size is None and spec.design is Design.probe:
        per_set = batch_size * len(spec.filler_lengths)
        size = per_set * max(1, round(size / per_set))
    return min(size, spec.trials_per_batch_size(batch_size))


def _entropy(seed: int, batch_size: int, stream: int) -> list[int]:
    # SeedSequence takes non-negative integers only; the sign travels separately so -1 and 1 differ.
    return [abs(seed), int(seed < 0), batch_size, stream]
