"""Alembic migrations of the posbias store. `service.migrate` runs them (`posbias db upgrade`)."""
