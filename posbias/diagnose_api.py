"""`posbias diagnose` from Python: plan a battery of jobs that separates the suspects behind a model's
position curve, submit it as a group of ordinary jobs, and read it into one verdict per suspect once its
jobs are done.

    import posbias

    outcome = posbias.diagnose("google/gemma-2-2b-it", budget=4000)
    # ... `posbias worker --until-empty` (or the cluster) runs the jobs ...
    outcome = posbias.diagnose("google/gemma-2-2b-it", budget=4000)   # the same jobs: now the verdicts
    print(outcome.diagnosis.summary)
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from posbias import edge
from posbias.api import _settings, _store
from posbias.schemas import EngineName, FakeSpec, PosbiasError
from posbias.schemas.bounds import INT64_MAX
from posbias.schemas.diagnosis import BatteryRequest, DiagnoseOutcome, Diagnosis
from posbias.service.diagnose import DEFAULT_BUDGET, diagnosis_page
from posbias.service.diagnose import diagnose as run_diagnosis
from posbias.service.settings import Settings

VIEW_URL = "http://127.0.0.1:8765"
"""Where a diagnosis page's links point by default: `posbias view --port 8765`, as its help's example."""


@edge.public
def diagnose(
    model: str,
    *,
    settings: Settings | None = None,
    budget: int = DEFAULT_BUDGET,
    dry_run: bool = False,
    engine: str = EngineName.vllm,
    fake: FakeSpec | Mapping[str, Any] | None = None,
    seed: int = 0,
    replan: bool = False,
) -> DiagnoseOutcome:
    """Plan the battery for `model` from its config facts (the store's record of it, else its config on this
    machine; a fake's own for engine `fake`), within `budget` trials. `dry_run`: plan and cost it (trials,
    prompt tokens, GPU time at the store's past rate) and submit nothing. Otherwise submit each job under its
    idempotency key and, when every one is done, read the diagnosis.

    The battery is stored at its first submit: a later call with the same arguments reads that one (its jobs
    by their keys, as submitted), whatever a newer posbias would plan, and says how a fresh plan would
    differ (`plan_change`). `replan`: plan afresh and, when that differs, submit it under keys of its own in
    place of the stored battery (whose jobs stay in the store)."""
    model = edge.text(model, what="model")
    budget = edge.whole(budget, what="budget", low=1, high=10_000_000)
    engine = edge.text(str(engine), what="engine")
    seed = edge.whole(seed, what="seed", low=-INT64_MAX, high=INT64_MAX)
    if fake is not None and not isinstance(fake, FakeSpec):
        try:
            fake = FakeSpec.model_validate(dict(fake))
        except ValueError as exc:
            raise PosbiasError(f"invalid fake settings: {exc}") from None
    if fake is not None and engine != EngineName.fake:
        raise PosbiasError("fake settings are for engine fake: add --engine fake")
    given = None if fake is None else fake.model_dump(mode="json", exclude_unset=True)
    request = BatteryRequest(model=model, engine=engine, budget=budget, seed=seed, fake=given)
    settings = _settings(settings)
    with ExitStack() as stack:
        try:
            db = stack.enter_context(_store(settings, read_only=dry_run))
        except PosbiasError:
            if not dry_run:
                raise
            db = None  # a dry run needs no store: it only has no past rates (and no stored battery) then
        outcome: DiagnoseOutcome = run_diagnosis(
            db, request, settings=settings, dry_run=dry_run, replan=bool(replan)
        )
        return outcome


@edge.public
def write_diagnosis(diagnosis: Diagnosis, *, path: str | Path, view_url: str = VIEW_URL) -> Path:
    """The diagnosis as a self-contained HTML page at `path`; each number links to its jobs' pages in the
    viewer at `view_url` (`posbias view --port 8765` by default)."""
    target = Path(path)
    try:
        target.write_text(diagnosis_page(diagnosis, base_url=edge.text(view_url, what="view_url")))
    except OSError as exc:
        raise PosbiasError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target
