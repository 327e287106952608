"""The store's schema version: the revisions the migrations package holds, the newest of them, the one a
database is at, and the check `database.connect` makes. Read from the migration scripts and the
`alembic_version` table without importing Alembic, which only `service.store.migrate` needs.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DBAPIError

from posbias import migrations
from posbias.schemas import PosbiasError
from posbias.service.store.database_url import UPGRADE_HINT, URL_HINT, describe
from posbias.service.store.store_errors import explain

_REVISION = re.compile(r'^(revision|down_revision)\b[^=\n]*=\s*(?:"([^"]+)"|None)\s*$', re.M)


@functools.cache
def revisions() -> dict[str, str | None]:
    """Every schema revision of the migrations package and the one it follows (None for the first), read
    from the scripts' `revision` and `down_revision` lines. Importing Alembic costs every command a few
    tenths of a second, and only `db upgrade` and `db downgrade` need it (a unit test checks that this
    reads what Alembic reads)."""
    found: dict[str, str | None] = {}
    for script in sorted((Path(next(iter(migrations.__path__))) / "versions").glob("[0-9]*.py")):
        fields = {name: value for name, value in _REVISION.findall(script.read_text(encoding="utf-8"))}
        found[fields["revision"]] = fields.get("down_revision") or None
    return found


def head() -> str:
    """The newest schema revision this posbias knows: the one no other revision follows."""
    followed = set(revisions().values())
    heads = [revision for revision in revisions() if revision not in followed]
    assert len(heads) == 1, f"the migrations package must have one head, not {heads}"
    return heads[0]


def current_revision(connection: Connection) -> str | None:
    """The database's Alembic revision, as Alembic keeps it (`alembic_version`); None when it has none."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    found = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return str(found[0]) if found else None


def check_schema(engine: Engine) -> None:
    """Raise `PosbiasError` unless the database behind `engine` is reachable and at the head revision."""
    try:
        with engine.connect() as connection:
            revision = current_revision(connection)
    except DBAPIError as exc:
        raise explain(exc, url=engine.url) from None
    where = describe(engine.url)
    newest = head()
    if revision == newest:
        return
    if revision is None:
        raise PosbiasError(f"the database at {where} has no posbias tables yet: {UPGRADE_HINT}")
    if revision not in revisions():
        raise PosbiasError(
            f"the database at {where} is at schema revision {revision[:40]!r}, which this posbias does not "
            f"know: it was migrated by a newer posbias (pip install -U posbias) or belongs to another "
            f"application ({URL_HINT})"
        )
    raise PosbiasError(
        f"the database at {where} is at schema revision {revision}, this posbias needs {newest}: "
        f"{UPGRADE_HINT}"
    )
