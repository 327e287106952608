"""Alembic migrations of the posbias store. `service.database` runs them (`posbias db upgrade`)."""
