"""One trial behind a number: the prompt it sent, where each question sits in it, its raw output and what was
made of every answer (`posbias trial`, the report's and the viewer's trial pages).

Prompts are not stored: a trial's prompt is a pure function of what is (the job's spec, the trial's plan,
its questions) and of the model's tokenizer and chat template, so it is rendered again here by the very
function the worker used (`workers.prompts.render_trial`). Storing every prompt would cost more than all of
a job's results (a 50-question prompt is about 5,000 tokens); rebuilding it costs one tokenizer load. What
keeps the rebuilt prompt honest is what the worker did store when it sent the trial: the prompt's length in
tokens, each question's token span, the filler's span. `TrialView.check` compares every one of them, and a
tokenizer or template that changed since shows up there as a difference, never as a silently other prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from posbias.schemas import (
    JobSpec,
    NotFoundError,
    ParseStatus,
    PosbiasError,
    Question,
    Trial,
    one_line,
)
from posbias.schemas.trial import AnswerView, PromptCheck, PromptSource, QuestionSpan, TrialView
from posbias.service.settings import Settings
from posbias.service.store import not_found, tables
from posbias.service.work import load_spec
from posbias.workers.engine import Tokenizer
from posbias.workers.engines import declared
from posbias.workers.light_tokenizer import LightTokenizer, light_tokenizer
from posbias.workers.prompts import RenderedPrompt, RenderedQuestion, render_trial


def trial_detail(
    session: Session,
    job_id: int,
    trial_id: int,
    *,
    variant: str | None = None,
    tokenizer: Tokenizer | None = None,
    cache_dir: str | Path | None = None,
    tokens: bool = True,
) -> TrialView:
    """Trial `trial_id` of job `job_id` as sent, answered and scored; with `variant`, the matched trial of
    that variant of the job (the same questions in the same places; a job's variants answer the same
    trials). The prompt is rendered with `tokenizer`, else the model's own when it is on this machine
    (`cache_dir`, by default the settings' default, holds converted GGUF models), else without token ids
    (`PromptSource.text_only`). `tokens=False` leaves out the prompt's token ids and each token's
    characters (a report's page draws neither: about 10,000 of each for a 50-question prompt).

    `NotFoundError` when the job, the trial or the variant is not there.
    """
    job = session.get(tables.Job, job_id)
    if job is None:
        raise not_found(job_id)
    row = session.get(tables.Trial, trial_id)
    if row is None or row.job_id != job_id:
        raise NotFoundError(
            f"job {job_id} has no trial {trial_id}: its trial ids are the trial_id column of "
            f"`posbias export {job_id}` (or posbias.trials({job_id}))"
        )
    spec = load_spec(job.spec)
    names = [run.name for run in spec.runs]
    if variant is not None and variant != row.variant:
        if variant not in names:
            raise NotFoundError(f"job {job_id} has no variant {variant!r}; its variants: {', '.join(names)}")
        row = _matched(session, row, variant=variant, names=names)
    trial = _trial(row)
    questions = _questions(session, trial.question_ids)
    if tokenizer is None:
        tokenizer = prompt_tokenizer(spec, cache_dir=cache_dir)
    results = {
        r.position: r
        for r in session.scalars(
            select(tables.Result).where(tables.Result.trial_id == row.id).order_by(tables.Result.position)
        )
    }
    rendered = rebuilt(
        row, trial, list(results.values()), spec=spec, questions=questions, tokenizer=tokenizer
    )
    window = _sliding_window(session, job, variant=row.variant)
    offsets = _offsets(rendered, whole=tokens)
    spans = [
        _span(q, results.get(q.position), rendered=rendered, window=window, offsets=offsets)
        for q in rendered.questions
    ]
    return TrialView(
        job_id=job_id,
        trial_id=row.id,
        trial_index=row.index,
        batch_size=row.batch_size,
        iteration=row.iteration,
        variant=row.variant,
        variants=[name for name in names if _has_variant(session, row, name, names=names)],
        model=job.model,
        revision=job.revision,
        status=row.status,
        skip_reason=row.skip_reason,
        design=spec.design.value,
        answer_order=row.answer_order,
        probe_position=row.probe_position,
        filler_tokens=row.filler_tokens,
        filler_span=rendered.filler_tokens,
        chat_template_used=rendered.chat_template_used,
        sliding_window=window,
        prompt_source=PromptSource.rebuilt if rendered.token_ids is not None else PromptSource.text_only,
        prompt_text=rendered.text,
        prompt_token_ids=None if rendered.token_ids is None or not tokens else list(rendered.token_ids),
        token_offsets=offsets if tokens else None,
        check=_check(row, list(results.values()), rendered=rendered),
        spans=spans,
        output_text=row.output_text,
        output_tokens=row.output_tokens,
        answers=[_answer(r) for r in results.values()],
    )


def _matched(session: Session, row: tables.Trial, *, variant: str, names: Sequence[str]) -> tables.Trial:
    """The trial of `variant` that shows what `row` shows (the planner copies one variant's trials).

    The planner lays the variants' trials out one after another, the k-th variant's i-th trial at index
    k x T + i of the job's T x len(names) (`planner.per_variant`), so the trial is read by the unique
    (job_id, index) and checked; only a job laid out otherwise has its trials searched."""
    t = tables.Trial
    last = session.scalar(select(func.max(t.index)).where(t.job_id == row.job_id))
    if last is not None and (last + 1) % len(names) == 0 and row.variant in names and variant in names:
        per = (last + 1) // len(names)
        index = row.index % per + names.index(variant) * per
        other = session.scalar(select(t).where(t.job_id == row.job_id, t.index == index))
        if other is not None and _same_plan(other, row, variant=variant):
            return other
    for other in session.scalars(
        select(t).where(
            t.job_id == row.job_id,
            t.variant == variant,
            t.batch_size == row.batch_size,
            t.iteration == row.iteration,
            t.rotation == row.rotation,
        )
    ):
        if _plan_key(other) == _plan_key(row):
            return other
    raise NotFoundError(f"variant {variant!r} of job {row.job_id} has no trial matching trial {row.id}")


def _same_plan(other: tables.Trial, row: tables.Trial, *, variant: str) -> bool:
    return (
        other.variant == variant
        and (other.batch_size, other.iteration, other.rotation)
        == (row.batch_size, row.iteration, row.rotation)
        and _plan_key(other) == _plan_key(row)
    )


def _has_variant(session: Session, row: tables.Trial, name: str, *, names: Sequence[str]) -> bool:
    if name == row.variant:
        return True
    try:
        _matched(session, row, variant=name, names=names)
    except NotFoundError:
        return False
    return True


def _plan_key(row: tables.Trial) -> tuple[object, ...]:
    return (row.question_ids, row.choice_orders, row.answer_order, row.probe_position, row.filler_tokens)


def _trial(row: tables.Trial) -> Trial:
    return Trial(
        index=row.index,
        batch_size=row.batch_size,
        iteration=row.iteration,
        question_ids=tuple(row.question_ids),
        choice_orders=None if row.choice_orders is None else tuple(tuple(o) for o in row.choice_orders),
        rotation=row.rotation,
        variant=row.variant,
        answer_order=None if row.answer_order is None else tuple(row.answer_order),
        probe=row.probe_position,
        filler_tokens=row.filler_tokens,
    )


def _questions(session: Session, ids: Sequence[str]) -> dict[str, Question]:
    q = tables.Question
    found = {
        row.id: Question(
            id=row.id,
            subject=row.subject,
            question=row.question,
            choices=tuple(row.choices),
            answer=row.answer,
        )
        for row in session.scalars(select(q).where(q.id.in_(sorted(set(ids)))))
    }
    missing = sorted(set(ids) - set(found))
    if missing:
        raise PosbiasError(f"the store lacks questions {', '.join(missing[:3])} of this trial; it is damaged")
    return found


def rebuilt(
    row: tables.Trial,
    trial: Trial,
    results: Sequence[tables.Result],
    *,
    spec: JobSpec,
    questions: dict[str, Question],
    tokenizer: Tokenizer | None,
) -> RenderedPrompt:
    """The trial's prompt rendered again. A prompt rendered with a `LightTokenizer` that does not pass the
    check against what the worker stored when it sent it, or has nothing stored to pass it, is rendered
    again with transformers' own tokenizer, so the view shows what was sent whichever reads faster."""
    if isinstance(tokenizer, LightTokenizer):
        try:
            rendered = render_trial(trial, spec=spec, questions=questions, tokenizer=tokenizer)
        except Exception:  # a template or file transformers reads otherwise: its own tokenizer decides
            rendered = None
        if rendered is not None and _check(row, results, rendered=rendered).matches:
            return rendered
        tokenizer = tokenizer.full()
    return render_trial(trial, spec=spec, questions=questions, tokenizer=tokenizer)


def prompt_tokenizer(spec: JobSpec, *, cache_dir: str | Path | None) -> Tokenizer | None:
    """The tokenizer the worker rendered `spec`'s prompts with, when it is on this machine: the engine's own
    (the fake engine's), the model's own (vLLM loads the same files), or, for a model whose files are not the
    workers' (a served one), the one its job names. A served model's server-side tokenizer is not reachable
    from the store, so its prompts are shown as text only. A tokenizer in a folder here is read without
    transformers where it can be (`LightTokenizer`: transformers imports torch, seconds before the first
    token), transformers' own loaded only where `rebuilt`'s check asks for it."""
    engine = declared(spec.engine.name)
    if engine.tokenizer is not None:
        return engine.tokenizer(spec)
    from posbias.workers.models import local_tokenizer, tokenizer_folder

    if not engine.local_model and spec.tokenizer is None:
        return None
    name = spec.model if engine.local_model or not spec.tokenizer else spec.tokenizer
    folder = cache_dir or Settings.model_fields["cache_dir"].get_default(call_default_factory=True)

    def load() -> Tokenizer | None:
        try:
            return local_tokenizer(name, tokenizer=spec.tokenizer, cache_dir=folder)
        except Exception as exc:  # a folder transformers cannot read; the view says why it has no tokens
            raise PosbiasError(
                f"cannot load the tokenizer of {spec.model} to rebuild the prompt: {one_line(exc)}"
            ) from exc

    def full() -> Tokenizer:  # the light one's files are here, so transformers finds them too
        found = load()
        if found is None:
            raise PosbiasError(f"the tokenizer of {spec.model} is no longer on this machine; read it again")
        return found

    try:
        files = tokenizer_folder(name, tokenizer=spec.tokenizer, cache_dir=folder)
    except PosbiasError:  # the model's files are gone; `load` says so as it always did
        files = None
    light = light_tokenizer(files, full=full) if files is not None else None
    return light if light is not None else load()


def _sliding_window(session: Session, job: tables.Job, *, variant: str) -> int | None:
    """The sliding window the variant's engine reported building (the model row its results recorded)."""
    model_id = session.scalar(
        select(tables.JobVariant.model_id).where(
            tables.JobVariant.job_id == job.id, tables.JobVariant.variant == variant
        )
    )
    model = session.get(tables.Model, model_id or job.model_id) if (model_id or job.model_id) else None
    return None if model is None else model.sliding_window


def _span(
    placed: RenderedQuestion,
    result: tables.Result | None,
    *,
    rendered: RenderedPrompt,
    window: int | None,
    offsets: Sequence[tuple[int, int]] | None,
) -> QuestionSpan:
    answer = result.answer_token_index if result is not None else None
    start = None
    if window is not None and answer is not None and rendered.prompt_tokens is not None:
        # The answer token is produced at sequence index prompt_tokens + answer - 1, whose sliding layers
        # attend to the `window` positions up to and including it (workers/shard.py `window_view`).
        start = max(0, rendered.prompt_tokens + answer - window)
    return QuestionSpan(
        position=placed.position,
        question_id=placed.question_id,
        start_token=placed.token_start,
        end_token=placed.token_end,
        start_char=placed.char_start,
        end_char=placed.char_end,
        answer_token=answer,
        window_start_token=start,
        window_start_char=None if start is None or offsets is None else int(offsets[start][0]),
    )


@dataclass(frozen=True)
class _Stored:
    """One figure the worker stored about a prompt, and the rebuilt prompt's."""

    name: str
    stored: int | None
    rebuilt: int | None


def _check(row: tables.Trial, results: Sequence[tables.Result], *, rendered: RenderedPrompt) -> PromptCheck:
    """Every figure the worker stored about the prompt it sent, against the rebuilt prompt's."""
    figures = [_Stored("prompt length", row.prompt_tokens, rendered.prompt_tokens)]
    if row.filler_token_start is not None:
        span = rendered.filler_tokens
        figures.append(_Stored("filler start", row.filler_token_start, span[0] if span else None))
        figures.append(_Stored("filler end", row.filler_token_end, span[1] if span else None))
    placed = {q.position: q for q in rendered.questions}
    for r in results:
        q = placed.get(r.position)
        start, end = (q.token_start, q.token_end) if q is not None else (None, None)
        figures.append(_Stored(f"question {r.position} start", r.question_token_start, start))
        figures.append(_Stored(f"question {r.position} end", r.question_token_end, end))
    compared = [f for f in figures if f.stored is not None]
    differences = tuple(
        f"{f.name}: stored {f.stored}, rebuilt {f.rebuilt}" for f in compared if f.stored != f.rebuilt
    )
    matches = None
    if compared and rendered.token_ids is not None:
        matches = not differences
    return PromptCheck(
        matches=matches,
        stored_prompt_tokens=row.prompt_tokens,
        rebuilt_prompt_tokens=rendered.prompt_tokens,
        compared=len(compared),
        differences=differences,
    )


def _offsets(rendered: RenderedPrompt, *, whole: bool = True) -> Sequence[tuple[int, int]] | None:
    """Each prompt token's character span, as `render` encoded it: with `whole` a list of pairs, else as
    the tokenizer gave them."""
    if rendered.token_offsets is None or rendered.token_ids is None:
        return None
    return [(a, b) for a, b in rendered.token_offsets] if whole else rendered.token_offsets


def _answer(r: tables.Result) -> AnswerView:
    return AnswerView(
        position=r.position,
        question_id=r.question_id,
        subject=r.subject,
        parsed=r.parse_status is ParseStatus.ok,
        parse_status=r.parse_status,
        prediction=r.predicted,
        gold=r.gold,
        correct=r.correct,
        option_probs=r.option_probs,
        gold_prob=r.gold_prob,
        answer_slot=r.answer_slot,
        answer_token=r.answer_token_index,
        token_distance=r.token_distance,
        in_window=r.in_window,
    )
