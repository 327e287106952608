"""`posbias trial`: one trial behind a number: the prompt as sent with each question's span and its answer's
window marked, the raw output, and every answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

import posbias
from posbias.cli.common import JobArg, id_parser, out, print_json, settings_of
from posbias.cli.errors import BadUsage
from posbias.schemas.limits import MAX_BATCH_SIZE

if TYPE_CHECKING:
    from posbias.schemas import AnswerView, QuestionSpan, TrialView


def register(app: typer.Typer) -> None:
    """Add `trial` to the app."""
    app.command()(trial)


def trial(
    ctx: typer.Context,
    job: JobArg,
    trial_id: Annotated[
        int,
        typer.Argument(metavar="TRIAL", help="Trial id (trial_id in exports).", parser=id_parser("trial id")),
    ],
    position: Annotated[
        int | None,
        typer.Option("--position", "-p", help="Mark and list one position only.", min=1, max=MAX_BATCH_SIZE),
    ] = None,
    variant: Annotated[
        str | None, typer.Option(help="The same trial as this variant of the job answered it.")
    ] = None,
    marks: Annotated[
        bool, typer.Option("--marks/--no-marks", help="Mark question spans and windows in the prompt.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole view as JSON.")] = False,
) -> None:
    """Show one trial: the prompt exactly as the engine was sent it (rebuilt from the stored plan with the
    model's tokenizer and chat template, and checked against the token counts the worker stored), each
    question's token span and the token its answer's sliding window reaches back to, marked in the text
    with «...» (not part of the prompt; --no-marks prints it bare), the raw output, and per answer the
    parse status, prediction, gold, correctness and option probabilities.

    Example: posbias trial 3 17 --position 5 --variant global-only
    """
    # The text shows no token ids: leaving them out spares checking 20,000 numbers of a 50-question trial.
    view = posbias.trial(job, trial_id, variant=variant, tokens=as_json, settings=settings_of(ctx))
    if position is not None and not 1 <= position <= view.batch_size:
        raise BadUsage(f"--position must be 1 to {view.batch_size}, the trial's batch size (got {position})")
    if position is not None:
        view = view.model_copy(
            update={
                "spans": [s for s in view.spans if s.position == position],
                "answers": [a for a in view.answers if a.position == position],
            }
        )
    if as_json:
        print_json(view.model_dump(mode="json"))
        return
    print_trial(view, marks=marks)


def print_trial(view: TrialView, *, marks: bool = True) -> None:
    """A trial view as a header, the marked prompt, the raw output and a table of its answers."""
    name = f"{view.model}{'@' + view.revision if view.revision else ''}"
    out.print(
        f"job {view.job_id} trial {view.trial_id} (index {view.trial_index}): batch size {view.batch_size}, "
        f"iteration {view.iteration}, variant {view.variant}, model {name}; {view.status.value}"
        + (f" ({view.skip_reason})" if view.skip_reason else ""),
        markup=False,
    )
    others = [v for v in view.variants if v != view.variant]
    if others:
        out.print(f"also answered by: {', '.join(others)} (--variant NAME)", markup=False)
    out.print(_design(view), markup=False)
    out.print(_check(view), markup=False)
    out.print("--- prompt ---", markup=False)
    out.print(_marked(view) if marks else view.prompt_text, markup=False, highlight=False)
    out.print("--- output ---", markup=False)
    out.print(view.output_text if view.output_text is not None else "(none: not run)", markup=False)
    if not view.answers and not view.spans:
        return
    out.print("--- answers (options 1-based as shown) ---", markup=False)
    answers = {a.position: a for a in view.answers}
    for span in view.spans:
        out.print(_answer_line(span, answers.get(span.position)), markup=False)


def _answer_line(span: QuestionSpan, a: AnswerView | None) -> str:
    """One position: where its question sits, where its answer is and what it scored."""
    words = [f"{span.position}."]
    if span.start_token is not None:
        words.append(f"question tokens {span.start_token}-{span.end_token}")
    if a is None:
        return " ".join([*words, "no answer stored"])
    if span.answer_token is not None:
        words.append(f"answer token {span.answer_token} (distance {a.token_distance})")
    if span.window_start_token is not None:
        inside = "inside" if a.in_window else "outside"
        words.append(f"window from token {span.window_start_token} ({inside})")
    words.append(a.parse_status.value)
    if a.prediction is not None:
        words.append(f"predicted {a.prediction + 1}")
    words.append(f"gold {a.gold + 1}")
    words.append("correct" if a.correct else "wrong")
    if a.option_probs is not None:
        words.append("p(options) " + " ".join(f"{p:.2f}" for p in a.option_probs))
    return words[0] + " " + ", ".join(words[1:])


def _design(view: TrialView) -> str:
    words = [f"design {view.design}"]
    if view.answer_order is not None:
        words.append("answers asked in the order " + ", ".join(map(str, view.answer_order)))
    if view.probe_position is not None:
        words.append(f"question {view.probe_position} asked")
    if view.filler_tokens:
        where = f" at tokens {view.filler_span[0]}-{view.filler_span[1]}" if view.filler_span else ""
        words.append(f"{view.filler_tokens} filler tokens{where}")
    if view.sliding_window is not None:
        words.append(f"sliding window {view.sliding_window} tokens")
    words.append("chat template" if view.chat_template_used else "no chat template")
    return "; ".join(words)


def _check(view: TrialView) -> str:
    tokens = view.check.rebuilt_prompt_tokens
    if view.prompt_source.value == "text_only":
        return "prompt: rebuilt as text (the model's tokenizer is not on this machine): no token ids or spans"
    head = f"prompt: {tokens} tokens, rebuilt with the model's tokenizer"
    if view.check.matches is None:
        return head + "; nothing stored to check it against (not run yet)"
    if view.check.matches:
        return head + f"; identical to what was sent (all {view.check.compared} stored token figures match)"
    shown = "; ".join(view.check.differences[:5])
    return head + f"; DIFFERS from what was sent ({shown}): the tokenizer or template changed since"


def _marked(view: TrialView) -> str:
    """The prompt with «qK» before and «/qK» after each question, and «window of K» where the sliding
    window of K's answer starts."""
    inserts: list[tuple[int, int, str]] = []
    for span in view.spans:
        tokens = f" tokens {span.start_token}-{span.end_token}" if span.start_token is not None else ""
        inserts.append((span.start_char, 1, f"«q{span.position}{tokens}»"))
        inserts.append((span.end_char, 0, f"«/q{span.position}»"))
        if span.window_start_char is not None:
            inserts.append((span.window_start_char, 2, f"«window of answer {span.position} starts here»"))
    marked = view.prompt_text
    for at, _, mark in sorted(inserts, key=lambda i: (i[0], i[1]), reverse=True):
        marked = marked[:at] + mark + marked[at:]
    return marked
