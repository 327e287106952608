"""The `posbias` command, one module per command group: `submit` (submit, run), `worker`, `jobs` (status,
cancel, retry), `curves` (curve, compare), `export`, `models`, `db`, `schedule`; `app` mounts them and turns
errors into one line. Each command parses its flags, calls the Python API (`posbias.api`) and renders."""
