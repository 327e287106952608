"""Alembic migrations of the posbias store. `service.store.migrate` runs them (`posbias db upgrade`)."""
