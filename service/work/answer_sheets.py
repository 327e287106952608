"""`engine.answer_sheet: {job: N}` for the `hf` engine: teacher-force what job N (e.g. a vLLM job of the same
trials) answered, so that the attention recorded pairs with what the model actually did.

`check` refuses the spec at submit, in one line, unless job N exists, is done and has the same trials (by
index: batch size, variant, questions, option and answer orders, filler). `attach` fills each leased shard's
`ShardSpec.answers` from job N's parsed answers (the 1-based option per position); a position job N did not
parse gets the gold answer on the sheet (`HfEngine`).
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa

from posbias.schemas import JobSpec, Plan, PosbiasError, ShardSpec
from posbias.schemas.attention import SheetFromJob
from posbias.service.stats import plan_keys, trial_keys
from posbias.service.store import Database
from posbias.workers.engines import declared


def sheet_job(spec: JobSpec) -> int | None:
    """The job a spec teacher-forces the answers of, when its engine reads answer sheets and it names one."""
    sheet = spec.engine.answer_sheet
    reads = declared(spec.engine.name).answer_sheets
    return sheet.job if reads and isinstance(sheet, SheetFromJob) else None


def check(db: Database, spec: JobSpec, plan: Plan) -> None:
    """`PosbiasError` when `spec` names an answer-sheet job that is missing, not done, or of other trials."""
    job = sheet_job(spec)
    if job is None:
        return
    with db.read() as session:
        status = session.execute(sa.text("SELECT status FROM jobs WHERE id = :j"), {"j": job}).scalar()
    if status is None:
        raise PosbiasError(f"engine.answer_sheet names job {job}, which does not exist; give a done job's id")
    if str(status) != "done":
        raise PosbiasError(
            f"engine.answer_sheet names job {job}, which is {status}, not done; wait for it, or give a done "
            "job"
        )
    theirs, ours = trial_keys(db, job), plan_keys(plan.trials)
    if theirs != ours:
        differ = sorted(i for i in ours.keys() | theirs.keys() if ours.get(i) != theirs.get(i))
        raise PosbiasError(
            f"engine.answer_sheet names job {job}, whose trials differ from this job's ({len(differ)} of "
            f"{max(len(ours), len(theirs))}, first at trial index {differ[0]}): submit this job with job "
            f"{job}'s spec (same seed, dataset, batch sizes, iterations, design) and engine hf"
        )


def attach(db: Database, shards: Mapping[int, ShardSpec]) -> dict[int, ShardSpec]:
    """`shards` with `answers` filled for those whose job teacher-forces another job's answers."""
    found = dict(shards)
    for shard_id, shard in shards.items():
        sheet = shard.engine.answer_sheet
        if not isinstance(sheet, SheetFromJob) or not declared(shard.engine.name).answer_sheets:
            continue
        indices = sorted({t.index for t in shard.trials})
        variants = sorted({t.variant for t in shard.trials})
        answers: dict[int, dict[int, int]] = {i: {} for i in indices}
        query = sa.text(
            'SELECT t."index", r.position, r.predicted FROM results AS r '
            "JOIN trials AS t ON t.id = r.trial_id "
            'WHERE r.job_id = :j AND r.predicted IS NOT NULL AND t.variant IN :v AND t."index" IN :i'
        ).bindparams(sa.bindparam("v", expanding=True), sa.bindparam("i", expanding=True))
        with db.read() as session:
            for index, position, predicted in session.execute(
                query, {"j": sheet.job, "v": variants, "i": indices}
            ):
                answers[int(index)][int(position)] = int(predicted) + 1
        found[shard_id] = shard.model_copy(update={"answers": answers})
    return found
