"""The cost guard of served jobs (engine `openai`, `max_job_tokens`): what a job may spend on its endpoint,
and each shard's share of it.

At submit, a job whose token bound (`EndpointReport.token_bound`: its prompts, counted on a sample with the
endpoint's tokenizer when it has one, plus every output budget in full) is over its guard is refused. While
it runs, each shard may spend only its share of the guard: the guard is split over batch sizes as their
bounds are, and within a batch size over shards as their trials' estimated tokens are. The worker refuses a
shard, before sending anything, whose requests (those not already answered from its cache) could spend more
than its share, and stops sending once what the endpoint reports leaves too little; the job then stops. The
shares add up to the guard, so the job never spends more, however its shards are retried or spread over
workers; the price of needing no shared ledger is that a guard set at the bound itself may stop a shard
whose prompts are a little longer than its batch size's average: give it some headroom.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from posbias.schemas import ChatTemplateUse, EndpointReport, JobSpec, Plan, Question, Trial
from posbias.workers.prompts import render
from posbias.workers.tokenizer import estimated_prompt_tokens


def trial_estimate(trial: Trial, *, questions: Mapping[str, Question], spec: JobSpec) -> int:
    """A trial's tokens by the rule that needs no tokenizer: its prompt's characters, plus its output budget.
    The same on the submitting machine and on the dispatcher, which is all a share needs."""
    rendered = render(
        trial,
        questions=questions,
        template=spec.prompt,
        chat_template=ChatTemplateUse.off,
        tokenizer=None,
        filler=spec.filler,
        seed=spec.seed,
    )
    output = spec.sampling.max_tokens_for(len(rendered.asked), answer_mode=spec.answer_mode)
    return estimated_prompt_tokens(rendered.user_text) + output


def share_basis(spec: JobSpec, plan: Plan) -> dict[int, int]:
    """`trial_estimate` summed by batch size over the whole job."""
    totals: dict[int, int] = defaultdict(int)
    for trial in plan.trials:
        totals[trial.batch_size] += trial_estimate(trial, questions=plan.questions, spec=spec)
    return dict(totals)


def token_bounds(spec: JobSpec, plan: Plan, *, prompt_tokens: Mapping[int, list[int]]) -> dict[int, int]:
    """By batch size: its trials times (the mean sampled prompt length plus the output budget)."""
    bounds = {}
    for n in spec.batch_sizes:
        trials = sum(1 for t in plan.trials if t.batch_size == n)
        lengths = prompt_tokens.get(n) or [0]
        output = spec.sampling.max_tokens_for(n, answer_mode=spec.answer_mode)
        bounds[n] = math.ceil(trials * (sum(lengths) / len(lengths) + output))
    return bounds


def shard_budget(
    spec: JobSpec,
    report: EndpointReport | None,
    *,
    trials: Iterable[Trial],
    questions: Mapping[str, Question],
) -> int | None:
    """Tokens a shard of `trials` may spend: its share of the job's guard; None when the job has none."""
    guard = spec.engine.max_job_tokens
    if guard is None or report is None:
        return None
    total = sum(report.token_bounds.values())
    if total <= 0:
        return guard
    share = 0.0
    for trial in trials:
        basis = report.share_basis.get(trial.batch_size)
        bound = report.token_bounds.get(trial.batch_size, 0)
        if not basis:
            continue
        estimate = trial_estimate(trial, questions=questions, spec=spec)
        share += guard * (bound / total) * (estimate / basis)
    return math.floor(share)
