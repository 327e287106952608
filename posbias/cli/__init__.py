"""The `posbias` command, one module per command group: `submit` (submit, run; their job-spec flags in
`spec_flags`), `worker`, `jobs` (status, cancel, retry), `curves` (curve, compare), `explain`, `export`,
`models`, `db`, `schedule`; `app` mounts them, each imported only when its command is asked for (so flags
are parsed before the records and the API are imported), and `errors` turns whatever went wrong into one
line. Each command parses its flags, makes one call of the Python API (`import posbias`) and renders what it
returns."""
