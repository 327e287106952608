"""What would settle a `cannot tell`, and at what cost.

A finding whose interval is too wide to decide says how large a battery would decide it: an interval's
half-width shrinks as 1/sqrt(trials), and every job of a battery grows with `--budget` in proportion (the
behaviour job and each variant share it; the mechanism jobs take about 5%), so a half-width h over the
half-width t that would decide the call needs about (h/t)^2 times the budget. The target t is the
half-width that decides the call if the estimate held: the distance from the estimate to the line's bound
(ruled out) or to zero (implicated), whichever is reached first. Where the interval is already that narrow
and the call still undecided (explain's joint test, Holm-adjusted, did not confirm it), twice the budget is
the step named. A finding without an interval (the design cannot test it) keeps its reason, which names
the design that would: filler that reaches past the window, a random answer order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

import sqlalchemy as sa

from posbias.schemas.diagnosis import Battery, Call, Finding, Line
from posbias.service.diagnose.mechanism import AUROC_BOUND, GAP_BOUND
from posbias.service.store import Database
from posbias.workers import engines

DEFAULT_ENGINE = "vllm"
"""`posbias diagnose`'s default `--engine`: the command leaves it out."""


def tokens_per_trial(db: Database, job_ids: Iterable[int]) -> float | None:
    """Mean prompt tokens of the rendered trials of `job_ids` (None when none has been rendered)."""
    with db.read() as session:
        total, count = session.execute(
            sa.text(
                "SELECT sum(prompt_tokens), count(prompt_tokens) FROM trials WHERE job_id IN :ids"
            ).bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": sorted(set(job_ids))},
        ).one()
    return float(total) / int(count) if count else None


def settled(
    finding: Finding,
    *,
    battery: Battery,
    tokens: float | None,
    bounds: Mapping[Line, float],
    more: str,
) -> Finding:
    """`finding` with `settle` filled for a `cannot tell` (and the stock `more` sentence taken off its
    reason); any other finding as it is. `bounds`: each line's bound in points; `tokens`: prompt tokens per
    trial of the battery so far."""
    if finding.call is not Call.cannot_tell or finding.settle is not None:
        return finding
    reason = finding.reason.removesuffix(f": {more}")
    effect = finding.effect
    if effect is None or effect.estimate is None or effect.low is None or effect.high is None:
        return finding.model_copy(update={"reason": reason, "settle": reason})
    centre, bound = {"AUROC": (0.5, AUROC_BOUND), "%": (0.0, GAP_BOUND)}.get(
        finding.unit, (0.0, bounds.get(finding.line, 0.0))
    )
    text = by_budget(
        half=(effect.high - effect.low) / 2,
        off=abs(effect.estimate - centre),
        bound=bound,
        battery=battery,
        tokens=tokens,
        unit=finding.unit,
    )
    return finding.model_copy(update={"reason": reason, "settle": text})


def by_budget(
    *, half: float, off: float, bound: float, battery: Battery, tokens: float | None, unit: str
) -> str:
    """The command and cost that would bring a half-width `half` to the target (see the module); `off`:
    the estimate's distance from no effect."""
    target = max(off, bound - off)
    factor = (half / target) ** 2 if target > 0 else math.inf
    if not math.isfinite(factor):
        return "more trials: the estimate sits on the line's bound, so no budget can be named"
    decided = factor > 1
    factor = factor if decided else 2.0
    budget = _round_up(battery.budget * factor)
    more = max(0, round(battery.total_trials * (budget / battery.budget - 1)))
    cost = f"about {more:,} more trials" + (f", ~{_tokens(more * tokens)} prompt tokens" if tokens else "")
    command = f"`{_command(battery, budget)}` ({cost})"
    if not decided:
        return f"{command}: the interval is narrow enough; the joint test needs more trials to confirm it"
    return f"{command} would narrow it to +/-{_amount(target, unit)}"


def _command(battery: Battery, budget: int) -> str:
    """`posbias diagnose` of `battery` at another budget, with the options that made its plan."""
    behaviour = battery.jobs[0].spec
    engine = str(behaviour.engine.name)
    words = ["posbias", "diagnose", battery.model]
    if engine != DEFAULT_ENGINE:
        words += ["--engine", engine]
    if engines.declared(engine).reads_fake:
        fake = json.dumps(
            behaviour.fake.model_dump(mode="json", exclude_defaults=True), separators=(", ", ": ")
        )
        words += ["--fake", f"'{fake}'"]
    words += ["--budget", str(budget)]
    if behaviour.seed:
        words += ["--seed", str(behaviour.seed)]
    return " ".join(words)


def _round_up(value: float) -> int:
    """Up to two significant figures: 6,351 -> 6,400."""
    if value <= 0:
        return 0
    step = 10 ** max(0, math.floor(math.log10(value)) - 1)
    return int(math.ceil(value / step) * step)


def _tokens(count: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= size:
            return f"{count / size:.1f}{suffix}"
    return f"{count:.0f}"


def _amount(value: float, unit: str) -> str:
    if unit == "AUROC":
        return f"{value:.2f} AUROC"
    if unit == "%":
        return f"{value:.1f}%"
    return f"{value:.1f} {unit}"
