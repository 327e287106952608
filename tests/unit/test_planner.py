"""The planner: deterministic trials from the seed, both designs, option shuffling, shards, shard specs."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from posbias.schemas import Design, JobSpec, PosbiasError, QuestionPool, RotationCostWarning, ShardSpec
from posbias.service.work.planner import QUESTIONS_PER_SHARD, plan
from posbias.service.work.shards import shard_spec

PoolFactory = Callable[..., QuestionPool]


def _spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"model": "m", **fields})


def test_same_spec_same_trials(make_pool: PoolFactory) -> None:
    pool = make_pool(200)
    spec = _spec(batch_sizes=[1, 5, 20], iterations=30, seed=7, shuffle_choices=True)
    assert plan(spec, pool=pool) == plan(spec, pool=pool)
    other = plan(_spec(batch_sizes=[1, 5, 20], iterations=30, seed=8, shuffle_choices=True), pool=pool)
    assert other.trials != plan(spec, pool=pool).trials


def test_plan_is_fixed_across_machines_and_versions(make_pool: PoolFactory) -> None:
    # A golden value: if this changes, stored jobs can no longer be re-planned to the same trials.
    pool = make_pool(100)
    trial = plan(_spec(batch_sizes=[3], iterations=1, seed=0), pool=pool).trials[0]
    assert trial.question_ids == GOLDEN_SEED_0


GOLDEN_SEED_0 = ("beta/eeb30bb36f58", "beta/711f3c246c79", "beta/9a22ac128219")


def test_load_order_does_not_matter(make_pool: PoolFactory) -> None:
    pool = make_pool(100)
    reversed_pool = QuestionPool(questions=pool.questions[::-1], subjects=pool.subjects, source="reversed")
    spec = _spec(batch_sizes=[10], iterations=5)
    assert plan(spec, pool=pool) == plan(spec, pool=reversed_pool)


def test_one_batch_size_does_not_change_another(make_pool: PoolFactory) -> None:
    pool = make_pool(100)
    alone = plan(_spec(batch_sizes=[10], iterations=5), pool=pool)
    together = plan(_spec(batch_sizes=[5, 10], iterations=5), pool=pool)
    assert [t.question_ids for t in alone.trials] == [
        t.question_ids for t in together.trials if t.batch_size == 10
    ]


def test_random_design(make_pool: PoolFactory) -> None:
    pool = make_pool(60)
    spec = _spec(batch_sizes=[20, 1, 5], iterations=12)
    planned = plan(spec, pool=pool)

    assert [t.index for t in planned.trials] == list(range(12 * 3))
    assert [t.batch_size for t in planned.trials] == [1] * 12 + [5] * 12 + [20] * 12
    assert [t.iteration for t in planned.trials] == list(range(12)) * 3
    for trial in planned.trials:
        assert len(trial.question_ids) == trial.batch_size
        assert len(set(trial.question_ids)) == trial.batch_size
        assert trial.rotation == 0
        assert trial.choice_orders is None
    used = {qid for t in planned.trials for qid in t.question_ids}
    assert set(planned.questions) == used
    assert all(planned.questions[qid].id == qid for qid in used)


def test_rotation_puts_every_question_at_every_position(make_pool: PoolFactory) -> None:
    pool = make_pool(80)
    spec = _spec(batch_sizes=[4, 10], iterations=6, design=Design.rotation)
    planned = plan(spec, pool=pool)
    assert len(planned.trials) == spec.total_trials == 6 * 4 + 6 * 10

    for batch_size in (4, 10):
        for iteration in range(6):
            group = [t for t in planned.trials if t.batch_size == batch_size and t.iteration == iteration]
            assert [t.rotation for t in group] == list(range(batch_size))
            sampled = group[0].question_ids
            assert len(set(sampled)) == batch_size
            for trial in group:
                r = trial.rotation
                assert trial.question_ids == tuple(sampled[(i + r) % batch_size] for i in range(batch_size))
            placements = Counter((qid, pos) for t in group for pos, qid in enumerate(t.question_ids, start=1))
            assert set(placements) == {(qid, pos) for qid in sampled for pos in range(1, batch_size + 1)}
            assert set(placements.values()) == {1}


def test_rotation_above_twenty_warns_of_its_cost(make_pool: PoolFactory) -> None:
    with pytest.warns(RotationCostWarning, match="50x"):
        spec = _spec(batch_sizes=[50], iterations=1, design=Design.rotation)
    assert len(plan(spec, pool=make_pool(60)).trials) == 50


def test_shuffled_options_keep_the_same_questions(make_pool: PoolFactory) -> None:
    pool = make_pool(50, n_choices=5)
    plain = plan(_spec(batch_sizes=[8], iterations=10, seed=3), pool=pool)
    shuffled = plan(_spec(batch_sizes=[8], iterations=10, seed=3, shuffle_choices=True), pool=pool)

    assert [t.question_ids for t in plain.trials] == [t.question_ids for t in shuffled.trials]
    orders = [order for t in shuffled.trials for order in (t.choice_orders or ())]
    assert len(orders) == 10 * 8
    assert all(sorted(order) == [0, 1, 2, 3, 4] for order in orders)
    assert len(set(orders)) > 20  # not one fixed permutation


def test_shards_hold_one_batch_size_and_every_trial_once(make_pool: PoolFactory) -> None:
    pool = make_pool(120)
    planned = plan(_spec(batch_sizes=[1, 7, 100], iterations=150), pool=pool)
    in_shards = [i for shard in planned.shards for i in shard.trial_indices]
    assert sorted(in_shards) == list(range(len(planned.trials)))
    assert [s.index for s in planned.shards] == list(range(len(planned.shards)))
    sizes = {}
    for shard in planned.shards:
        batch_sizes = {planned.trials[i].batch_size for i in shard.trial_indices}
        assert len(batch_sizes) == 1
        sizes.setdefault(batch_sizes.pop(), []).append(len(shard.trial_indices))
    # About QUESTIONS_PER_SHARD (500) questions a shard, but never more trials than there are.
    assert QUESTIONS_PER_SHARD == 500
    assert sizes[1] == [150]
    assert sizes[7] == [71, 71, 8]
    assert sizes[100] == [5] * 30


def test_shard_size_from_the_spec(make_pool: PoolFactory) -> None:
    planned = plan(_spec(batch_sizes=[2, 3], iterations=10, shard_size=4), pool=make_pool(20))
    assert [len(s.trial_indices) for s in planned.shards] == [4, 4, 2, 4, 4, 2]


def test_batch_size_larger_than_the_pool(make_pool: PoolFactory) -> None:
    with pytest.raises(PosbiasError, match="only 10"):
        plan(_spec(batch_sizes=[20]), pool=make_pool(10))


def test_shard_spec_is_self_contained(make_pool: PoolFactory) -> None:
    spec = _spec(batch_sizes=[5], iterations=8, engine={"name": "fake"}, fake={"first": 0.3}, shard_size=3)
    planned = plan(spec, pool=make_pool(40))
    shard = planned.shards[1]
    trials = [planned.trials[i] for i in shard.trial_indices]
    built = shard_spec(spec, job_id=9, shard_id=42, trials=trials, questions=planned.questions)

    assert built.job_id == 9
    assert built.shard_id == 42
    assert built.model_key == spec.model_key()
    assert built.fake.first == 0.3
    assert built.trials == tuple(trials)
    assert set(built.questions) == {qid for t in trials for qid in t.question_ids}
    assert ShardSpec.model_validate_json(built.model_dump_json()) == built
    with pytest.raises(ValueError, match="not in `questions`"):
        shard_spec(spec, job_id=9, shard_id=42, trials=trials, questions={})


def test_a_dry_run_over_many_filler_lengths_shows_its_progress_and_keeps_json_clean(
    mmlu_dir: Path, tmp_path: Path
) -> None:
    """220 filler lengths: one prompt rendered per length to count its tokens. Asked for (`--verbose`; a
    terminal's stderr gets a bar), the progress is lines on stderr, and stdout is the JSON alone."""
    from support.in_process import run_cli

    spec = {"model": "m", "engine": {"name": "fake"}, "batch_sizes": [2], "iterations": 1}
    spec["filler"] = {"tokens": list(range(220))}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {"POSBIAS_MMLU_DIR": str(mmlu_dir), "POSBIAS_CACHE_DIR": str(tmp_path / "cache")}
    args = ["submit", "spec.json", "--dry-run", "--json"]
    ran = run_cli(["--verbose", *args], env=env, folder=tmp_path, drop_prefix="POSBIAS_")
    assert ran.code == 0, ran.stderr
    assert len(json.loads(ran.stdout)["designs"]) == 220
    lines = ran.stderr.splitlines()
    assert lines[0] == "measuring prompts: 0/220"
    assert lines[-1] == "measuring prompts: 220/220"
    assert not (tmp_path / "posbias.db").exists()  # a dry run writes nothing


def test_measuring_the_longest_prompt_reports_each_filler_length_and_batch_size(
    make_pool: PoolFactory,
) -> None:
    """What submit shows while it sizes a vLLM job's context: one group per batch size and filler length."""
    from posbias.service.work.context import longest_prompt
    from posbias.workers.fake_engine import FakeTokenizer

    spec = _spec(batch_sizes=[2, 3], iterations=1, filler={"tokens": list(range(0, 300, 10))})
    calls: list[tuple[int, int]] = []
    found = longest_prompt(
        spec,
        plan(spec, pool=make_pool(50)),
        tokenizer=FakeTokenizer(),
        on_progress=lambda *c: calls.append(c),
    )
    assert found is not None and found.filler_tokens == 290
    assert calls[0] == (0, 60) and calls[-1] == (60, 60)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
