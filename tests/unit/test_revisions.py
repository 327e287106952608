"""The schema revisions posbias reads without Alembic (so commands start without importing it) are the ones
Alembic reads."""

from __future__ import annotations

import subprocess
import sys

from alembic.script import ScriptDirectory

from posbias.service.store import migrate, schema_version


def test_revisions_read_from_the_scripts_are_alembics() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    assert schema_version.revisions() == {rev.revision: rev.down_revision for rev in script.walk_revisions()}
    assert schema_version.head() == script.get_current_head()


def test_a_command_that_only_reads_the_store_does_not_import_alembic_or_scipy() -> None:
    code = "import sys, posbias.cli.app; print(sorted(m for m in ('alembic', 'scipy') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
