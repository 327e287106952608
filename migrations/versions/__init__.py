"""Schema revisions, oldest first. Each must run on SQLite and PostgreSQL (batch mode for table changes)."""
