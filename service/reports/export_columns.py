"""A job's results as the export's columns: Arrow record batches read from the database cursor, one row per
answer with its trial's coordinates and the job's settings, never a Python object per answer.

The answers come through `service.store.columns` (ADBC's drivers, batches filled in C) by the primary key of
`results`, trial by trial in the order of the job's trials (`trials`' unique (job_id, index)), so neither
database sorts a million rows; the trials' columns are read once, one row per trial, and spread over their
answers with Arrow's `take`. JSON columns are parsed by Arrow too: `option_probs` and `answer_order` are
stored as JSON arrays of numbers, which are split and cast (exactly: Arrow reads decimal text as Python's
`float` does, correctly rounded).

Nullable columns are read through a stand-in for NULL (SQLite's driver infers a column's type from its first
rows, see `columns`): an integer column through `NO_VALUE`, which no column of the store can hold (they are
32-bit on PostgreSQL and written from the same values on SQLite), the gold probability through -1 (a
probability is never negative), `in_window` as 0, 1 or 2 (for NULL), a JSON text through ''. Each stand-in
is turned back into a null before a batch leaves this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, Text, case, cast, select, type_coerce

from posbias.schemas import JobSpec
from posbias.service.store import Database, not_found, tables
from posbias.service.work import load_spec

if TYPE_CHECKING:
    import pyarrow as pa

_INT, _TEXT, _BOOL, _FLOAT = "int64", "string", "bool", "float64"
_INTS, _FLOATS, _TEXTS = "list<int64>", "list<float64>", "list<string>"

_JOB_COLUMNS: tuple[tuple[str, str], ...] = (
    ("model", _TEXT),
    ("revision", _TEXT),
    ("design", _TEXT),
    ("answer_order_kind", _TEXT),
    ("filler_where", _TEXT),
    ("filler_position", _INT),
)
"""The job's settings every row repeats: model as submitted, design, answer order (forward, reverse,
random), where its filler goes (null without filler) and after which question (`where: after`)."""

_TRIAL_COORDINATES: tuple[tuple[str, str], ...] = (
    ("variant", _TEXT),
    ("trial_id", _INT),
    ("trial_index", _INT),
    ("batch_size", _INT),
    ("iteration", _INT),
    ("rotation", _INT),
    ("answer_order", _INTS),
    ("probe_position", _INT),
    ("filler_tokens", _INT),
    ("filler_token_start", _INT),
    ("filler_token_end", _INT),
)
"""A trial's coordinates, as every export of results and trials has them."""

RESULT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("job_id", _INT),
    *_JOB_COLUMNS,
    *_TRIAL_COORDINATES,
    ("position", _INT),
    ("answer_slot", _INT),
    ("question_id", _TEXT),
    ("subject", _TEXT),
    ("gold", _INT),
    ("predicted", _INT),
    ("correct", _BOOL),
    ("parse_status", _TEXT),
    ("prompt_tokens", _INT),
    ("question_token_start", _INT),
    ("question_token_end", _INT),
    ("answer_token_index", _INT),
    ("token_distance", _INT),
    ("rope_distance", _INT),
    ("in_window", _BOOL),
    ("visible_layers", _INT),
    ("gold_prob", _FLOAT),
    ("option_probs", _FLOATS),
)
"""Every result export's columns and their Arrow types, in order: one row per answer."""

TRIAL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("job_id", _INT),
    *_JOB_COLUMNS,
    *_TRIAL_COORDINATES,
    ("question_ids", _TEXTS),
    ("status", _TEXT),
    ("skip_reason", _TEXT),
    ("prompt_tokens", _INT),
    ("output_tokens", _INT),
    ("output_text", _TEXT),
    ("answers", _INT),
    ("parsed", _INT),
    ("correct", _INT),
)
"""`posbias.trials`'s columns: one row per trial, its raw output and how many of its answers were stored,
parsed and correct."""

JSON_COLUMNS = ("answer_order", "option_probs")
"""The columns stored as JSON arrays of numbers: lists in Arrow, the JSON text in CSV."""

BATCH_ROWS = 65_536
"""Rows per batch read (a Parquet row group, a block of CSV lines): about 300 MB at the peak of an export,
against 530 MB in batches of `columns.BATCH_ROWS` (262,144 rows), for the same time."""

NO_VALUE = -(2**62)
"""What an integer column's NULL is read as (see the module's docstring)."""
_NO_PROB = -1.0
_NO_JSON = ""
_TRIAL_INTS = ("probe_position", "filler_token_start", "filler_token_end", "prompt_tokens")
_RESULT_INTS = (
    "answer_slot",
    "predicted",
    "question_token_start",
    "question_token_end",
    "answer_token_index",
    "token_distance",
    "rope_distance",
    "visible_layers",
)


def arrow_schema(columns: tuple[tuple[str, str], ...]) -> pa.Schema:
    """The Arrow schema of `RESULT_COLUMNS` or `TRIAL_COLUMNS`."""
    import pyarrow as pa

    types = {
        _INT: pa.int64(),
        _TEXT: pa.string(),
        _BOOL: pa.bool_(),
        _FLOAT: pa.float64(),
        _INTS: pa.list_(pa.int64()),
        _FLOATS: pa.list_(pa.float64()),
        _TEXTS: pa.list_(pa.string()),
    }
    return pa.schema([(name, types[kind]) for name, kind in columns])


def job_values(db: Database, job_id: int) -> dict[str, Any]:
    """The job's model and design settings as `_JOB_COLUMNS` has them; `NotFoundError` without the job."""
    with db.read() as session:
        found = session.execute(
            select(tables.Job.model, tables.Job.spec).where(tables.Job.id == job_id)
        ).first()
    if found is None:
        raise not_found(job_id)
    return job_columns(load_spec(found.spec), model=found.model)


def job_columns(spec: JobSpec, *, model: str) -> dict[str, Any]:
    """`_JOB_COLUMNS`' values for a job of `spec` whose model is stored as `model`."""
    filler = spec.filler
    return {
        "model": model,
        "revision": spec.revision,
        "design": spec.design.value,
        "answer_order_kind": spec.answer_order.value,
        "filler_where": None if filler is None else filler.where.value,
        "filler_position": None if filler is None else filler.position,
    }


def result_batches(
    db: Database,
    job_id: int,
    *,
    variant: str | None = None,
    batch_size: int | None = None,
    json_text: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Every result of `job_id` (of one variant, of one batch size) as record batches of `RESULT_COLUMNS`,
    by trial index and position; with `json_text`, the `JSON_COLUMNS` are strings instead, each value's text
    as `json.dumps` writes the value (`csv_text` writes them so). `NotFoundError`, raised here before any
    batch is read, when there is no such job. Close the iterator to end its query early."""
    from posbias.service.store import columns

    job = job_values(db, job_id)
    trials = _trials(db, job_id, variant=variant, batch_size=batch_size, json_text=json_text)
    query = (
        select(
            tables.Result.trial_id,
            tables.Result.position,
            *_results_columns(),
        )
        .select_from(tables.Trial)
        .join(tables.Result, tables.Result.trial_id == tables.Trial.id)
        .where(*_trial_filter(job_id, variant=variant, batch_size=batch_size))
        .order_by(tables.Trial.index, tables.Result.position)
    )
    return _batches(
        columns.record_batches(db, query, batch_rows=BATCH_ROWS) if trials.num_rows else iter(()),
        trials=trials,
        job={"job_id": job_id, **job},
        json_text=json_text,
    )


def _results_columns() -> list[Any]:
    """What is read of each answer, the nullable columns through their stand-ins."""
    from posbias.service.store import columns

    r = tables.Result
    return [
        *(columns.filled(getattr(r, name), NO_VALUE).label(name) for name in _RESULT_INTS),
        r.question_id,
        r.subject,
        r.gold,
        r.correct,
        type_coerce(r.parse_status, String).label("parse_status"),
        case((r.in_window.is_(None), 2), (r.in_window.is_(True), 1), else_=0).label("in_window"),
        columns.filled(r.gold_prob, _NO_PROB).label("gold_prob"),
        columns.filled(cast(r.option_probs, Text), _NO_JSON).label("option_probs"),
    ]


def _trial_filter(job_id: int, *, variant: str | None, batch_size: int | None) -> list[Any]:
    t = tables.Trial
    found = [t.job_id == job_id]
    if variant is not None:
        found.append(t.variant == variant)
    if batch_size is not None:
        found.append(t.batch_size == batch_size)
    return found


def _trials(
    db: Database, job_id: int, *, variant: str | None, batch_size: int | None, json_text: bool
) -> pa.Table:
    """The coordinates of the job's trials (one row per trial, so bounded by the job's trials, not its
    answers), decoded, with `trial_id` to look them up by."""
    import pyarrow as pa

    from posbias.service.store import columns

    t = tables.Trial
    read = columns.read_table(
        db,
        select(
            t.id.label("trial_id"),
            t.index.label("trial_index"),
            t.variant,
            t.batch_size,
            t.iteration,
            t.rotation,
            columns.filled(cast(t.answer_order, Text), _NO_JSON).label("answer_order"),
            t.filler_tokens,
            *(columns.filled(getattr(t, name), NO_VALUE).label(name) for name in _TRIAL_INTS),
        )
        .where(*_trial_filter(job_id, variant=variant, batch_size=batch_size))
        .order_by(t.index),
    )
    if not read.num_rows:
        return pa.table({"trial_id": pa.array([], pa.int64())})
    decoded = {name: _int64(read[name].combine_chunks()) for name in _TRIAL_INTS}
    decoded["answer_order"] = _json(read["answer_order"].combine_chunks(), pa.int64(), json_text=json_text)
    return pa.table({name: decoded.get(name, read[name].combine_chunks()) for name in read.column_names})


def _batches(
    batches: Iterator[pa.RecordBatch], *, trials: pa.Table, job: dict[str, Any], json_text: bool
) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema(RESULT_COLUMNS)
    if json_text:
        schema = pa.schema([pa.field(f.name, pa.string()) if f.name in JSON_COLUMNS else f for f in schema])
    trial_ids = trials["trial_id"].combine_chunks().cast(pa.int64())
    try:
        for batch in batches:
            n = batch.num_rows
            read = {name: batch.column(name) for name in batch.schema.names}
            of = trials.take(pc.index_in(read["trial_id"].cast(pa.int64()), value_set=trial_ids))
            values: dict[str, Any] = {name: of[name] for name in of.column_names}
            values.update(read)
            values.update({name: _int64(read[name]) for name in _RESULT_INTS})
            in_window = read["in_window"]
            values["in_window"] = pc.if_else(
                pc.equal(in_window, 2), pa.scalar(None, pa.bool_()), in_window.cast(pa.bool_())
            )
            gold_prob = read["gold_prob"]
            values["gold_prob"] = pc.if_else(
                pc.equal(gold_prob, _NO_PROB), pa.scalar(None, pa.float64()), gold_prob
            )
            values["option_probs"] = _json(read["option_probs"], pa.float64(), json_text=json_text)
            for name, value in job.items():
                values[name] = pa.repeat(pa.scalar(value, schema.field(name).type), n)
            yield pa.RecordBatch.from_arrays([_as(values[f.name], f.type) for f in schema], schema=schema)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a stream cut short still ends its query (and its cursor)


def _as(values: Any, type: pa.DataType) -> pa.Array:
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values if values.type == type else values.cast(type)


def _int64(values: pa.Array) -> pa.Array:
    """An integer column read through `NO_VALUE`, with its nulls back."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = values.cast(pa.int64())
    return pc.if_else(pc.equal(values, NO_VALUE), pa.scalar(None, pa.int64()), values)


def _json(text: pa.Array, value_type: pa.DataType, *, json_text: bool) -> pa.Array:
    """A JSON array of numbers per row (SQL NULL read as '', JSON null as 'null': both null), as a list
    array of `value_type` or, with `json_text`, as the text `json.dumps(json.loads(value))` gives.

    The text: posbias writes these arrays with `json.dumps` (SQLAlchemy's JSON type) or, for
    probabilities, with "%.8g" per number (`store.rows`), whose every number `json.loads` reads back and
    `json.dumps` writes again as it was (integers stay integers; a float's shortest repr is the text "%.8g"
    wrote, for probabilities); only the separators differ (', ' for ','), and "-0", which is written "0"."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pc.fill_null(text, _NO_JSON)
    missing = pc.or_(pc.equal(text, _NO_JSON), pc.equal(text, "null"))
    compact = text
    if pc.any(pc.match_substring_regex(text, r"\s")).as_py():  # json.dumps's ", " (never in "%.8g"'s)
        compact = pc.replace_substring_regex(text, r"\s+", "")
    if json_text:
        spaced = pc.replace_substring(compact, ",", ", ")
        for _ in range(2):  # a "-0" between two others' commas is matched on the second pass
            spaced = pc.replace_substring_regex(spaced, r"([\[ ])-0([,\]])", r"\10\2")
        return pc.if_else(missing, pa.scalar(None, pa.string()), spaced)
    inner = pc.utf8_slice_codeunits(compact, 1, -1)  # without the brackets
    inner = pc.if_else(pc.or_(missing, pc.equal(inner, "")), pa.scalar(None, pa.string()), inner)
    parts = pc.split_pattern(inner, ",")  # a null (none, or an empty list) splits into nothing
    return pa.ListArray.from_arrays(
        parts.offsets, parts.values.cast(value_type), type=pa.list_(value_type), mask=missing
    )
