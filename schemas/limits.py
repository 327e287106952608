"""The numeric limits a job's records and the `posbias` command's flags share, free of pydantic so that a
flag out of bounds is refused before the records are imported. `bounds.py` applies them to a spec."""

from __future__ import annotations

MAX_BATCH_SIZE = 200
"""Questions in one prompt at most."""

# What both stores can hold: PostgreSQL's INTEGER columns are 32 bits (priority, counts), ids and JSON
# numbers 64; a spec that SQLite would take must not fail on PostgreSQL.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
