"""The settings of this process as the API and the command read them (`load_settings`).

A module of its own, apart from `posbias/api.py`: every command reads its settings first, and a command that
only opens the store (`posbias trial`, `posbias db current`) should not pay for the analyses' imports.
"""

from __future__ import annotations

from posbias import edge
from posbias.service import settings as environment
from posbias.service.settings import Settings
from posbias.service.store import database_url


@edge.public
def load_settings() -> Settings:
    """The settings of this process (`POSBIAS_*` variables, then `.env`), read once as the command reads
    them: `PosbiasError` naming the fix for an invalid value or a malformed `POSBIAS_DATABASE_URL`, before
    anything is opened."""
    settings = environment.load_settings()
    database_url.normalise_url(settings.database_url)
    return settings
