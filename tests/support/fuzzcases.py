"""Bad input for the `posbias` command, as a hostile but realistic user types it, and what posbias promises
for each case: exit code 1 or 2, one line on stderr (`error: ...`), no traceback, nothing changed in the
store or in the working folder.

`generate(seed, context)` yields cases without end, drawn from templates (spec files, flags, ids, database
URLs, settings and `.env` files, datasets, exports, schedules, Ray addresses, served URLs and their ports,
control characters in paths and URLs, symbolic-link loops, special files, damaged stores), each case a
deterministic function of the seed. `run_in_process` runs a case through the real entry point and error
mapping (`posbias.cli.app.run`) in this process; `run_subprocess` runs it as the `posbias` command does;
`run_api` makes the same request of the Python API (`Case.api`, where a case has one), which must refuse it
with a posbias error and, where the refusal is below the command's flags, the very line the command prints.
Shared by tests/e2e/test_fuzz.py (a few hundred cases) and benchmarks/fuzz.py (thousands). Every address a
case names is on the loopback interface.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.in_process import _environment, run_cli

INF = float("inf")
NAN = float("nan")
VALID_SPEC: dict[str, Any] = {
    "model": "fake",
    "engine": {"name": "fake"},
    "batch_sizes": [2],
    "iterations": 2,
}
FAKE = ("--engine", "fake", "--batch-sizes", "2", "--iterations", "2")


@dataclass(frozen=True)
class Context:
    """What the cases may point at: the store under test and a few things around it."""

    store_url: str
    dialect: str
    job_id: int
    """A queued job in the store (no results)."""
    closed_port: int
    """A loopback port nothing listens on."""
    silent_port: int
    """A loopback port that accepts connections and never answers (not Ray, not PostgreSQL)."""
    postgres_port: int | None = None
    """The test PostgreSQL server's port (for wrong database names and users), when there is one."""
    foreign_postgres_url: str | None = None
    """A PostgreSQL database holding another application's table and no posbias schema."""
    store_sql: str = ""
    """SQL that recreates a small posbias SQLite store at the newest revision (`store_sql`): one fake job
    with a variant. Damaged stores are built from it; without it, the `damaged_store` template is not
    drawn."""


@dataclass(frozen=True)
class Case:
    """One command line with its environment and the files it needs in its working folder."""

    template: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    """Files to create (relative to the working folder)."""
    special: tuple[tuple[str, str, str], ...] = ()
    """(kind, path, detail): `dir`, `fifo`, `socket`, `symlink` (detail: its target), `sqlite` (detail: SQL
    to run in a new SQLite file)."""
    in_process: bool = True
    """False for cases that must be a real process (they reach for Ray: see the `ray_address` template)."""
    api: tuple[str, tuple[Any, ...], dict[str, Any]] | None = None
    """The same request of the Python API: a function of `posbias`, its arguments and keyword arguments
    (`settings` added by `run_api`); None where the command has no one call for it."""
    same_text: bool = True
    """False where the command refuses the input in its flags (click's message) before the API is called:
    the API must still refuse it, as a `UsageError`, in its own words."""

    def describe(self) -> str:
        """The case as a shell line (environment first), shortened."""
        env = " ".join(f"{k}={v!r}" for k, v in self.env.items())
        line = " ".join(repr(a) if (" " in a or not a) else a for a in self.args)
        text = f"[{self.template}] {env + ' ' if env else ''}posbias {line}"
        return text if len(text) < 300 else text[:297] + "..."


# --- what a run did -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What running a case did, and what of it breaks a promise."""

    case: Case
    code: int | None
    """The exit code; None when it did not finish in time (a hang)."""
    stdout: str
    stderr: str
    store_changed: bool
    files_changed: bool
    seconds: float

    @property
    def lines(self) -> list[str]:
        """Non-empty lines on stderr."""
        return [line for line in self.stderr.splitlines() if line.strip()]

    @property
    def problems(self) -> list[str]:
        """Every broken promise; empty when the case behaved."""
        found = []
        if self.code is None:
            return ["hang"]
        if "Traceback (most recent call last)" in self.stderr + self.stdout:
            found.append("traceback")
        if self.code not in (1, 2):
            found.append(f"exit {self.code}")
        if len(self.lines) != 1:
            found.append(f"{len(self.lines)} lines on stderr")
        elif not self.lines[0].startswith("error: "):
            found.append("stderr line is not `error: ...`")
        if any("internal error" in line for line in self.lines):
            found.append("internal error")
        if self.store_changed:
            found.append("store changed")
        if self.files_changed:
            found.append("working folder changed")
        return found

    def report(self) -> str:
        """The case, its problems and what it printed, for a failure message."""
        shown = self.stderr.strip().splitlines()
        tail = " | ".join(shown[-3:])[:600]
        return f"{self.case.describe()}: {', '.join(self.problems)} (exit {self.code}): {tail}"


# --- snapshots ------------------------------------------------------------------------------------------


def store_snapshot(url: str) -> str:
    """A digest of everything a store holds (every table's rows), read without writing; `missing` when it
    has no file, so a command that creates one is seen."""
    if url.startswith("sqlite"):
        path = Path(url.split(":///", 1)[1]) if ":///" in url else None
        if path is None or not path.is_file():
            return "missing" if path is None or not path.exists() else f"not a file: {path}"
        if path.stat().st_size == 0:
            return "empty file"
        try:
            connection = sqlite3.connect(f"file:{path}?mode=rw", uri=True)
        except sqlite3.Error as exc:
            return f"unopenable: {exc}"
        try:
            connection.execute("PRAGMA query_only = ON")
            names = [r[0] for r in connection.execute("SELECT name FROM sqlite_master ORDER BY name")]
            digest = hashlib.sha256(repr(names).encode())
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
                rows = sorted(map(repr, connection.execute(f'SELECT * FROM "{name}"')))
                digest.update(f"{name}:{rows}".encode())
            return digest.hexdigest()
        except sqlite3.Error as exc:
            return f"unreadable: {hashlib.sha256(path.read_bytes()).hexdigest()} ({exc})"
        finally:
            connection.close()
    import psycopg
    from sqlalchemy import make_url

    parsed = make_url(url)
    with psycopg.connect(
        host=parsed.host, port=parsed.port, user=parsed.username, dbname=parsed.database, autocommit=True
    ) as connection:
        names = [
            r[0]
            for r in connection.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1"
            )
        ]
        digest = hashlib.sha256(repr(names).encode())
        for name in names:
            rows = sorted(map(repr, connection.execute(f'SELECT * FROM "{name}"').fetchall()))
            digest.update(f"{name}:{rows}".encode())
        return digest.hexdigest()


def folder_snapshot(folder: Path) -> list[tuple[str, str, int, str]]:
    """Every entry under `folder`: path, kind, size and (for a regular file) a digest of its bytes."""
    entries = []
    for root, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = Path(root) / name
            info = path.lstat()
            kind = stat.S_IFMT(info.st_mode)
            digest = ""
            if stat.S_ISREG(info.st_mode) and info.st_size < 50_000_000:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            size = info.st_size if stat.S_ISREG(info.st_mode) else 0
            entries.append((str(path.relative_to(folder)), str(kind), size, digest))
    return sorted(entries)


# --- running a case -------------------------------------------------------------------------------------


def prepare(case: Case, folder: Path) -> None:
    """Create the case's files in `folder` (its working folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    for kind, name, detail in case.special:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            path.mkdir(exist_ok=True)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink":
            path.symlink_to(detail)
        elif kind == "socket":
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(path))
            server.close()
        elif kind == "sqlite":
            connection = sqlite3.connect(path)
            connection.executescript(detail)
            connection.commit()
            connection.close()
        else:
            raise ValueError(kind)


def environment(context: Context, case: Case, *, cache_dir: Path, mmlu_dir: Path) -> dict[str, str]:
    """The POSBIAS_* variables a case runs with (the context's store unless the case names its own)."""
    env = {
        "POSBIAS_DATABASE_URL": context.store_url,
        "POSBIAS_MMLU_DIR": str(mmlu_dir),
        "POSBIAS_CACHE_DIR": str(cache_dir),
        "POSBIAS_RAY_ADDRESS": f"127.0.0.1:{context.closed_port}",  # a case never reaches a real Ray
    }
    env.update(case.env)
    return env


def _check_store(case: Case, context: Context) -> str:
    url = case.env.get("POSBIAS_DATABASE_URL", context.store_url)
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return "in the working folder"  # a relative file: the folder's snapshot covers it
    try:
        return store_snapshot(url)
    except Exception as exc:  # a URL no snapshot can open: unchanged by definition, but said so
        return f"not readable: {type(exc).__name__}"


def run_in_process(
    case: Case, context: Context, *, folder: Path, cache_dir: Path, mmlu_dir: Path, timeout: float = 60
) -> Outcome:
    """Run `case` through `posbias.cli.app.run` in this process (working folder `folder`), set up as a
    process of its own would be (tests/support/in_process.py), in a thread given up after `timeout`."""
    prepare(case, folder)
    env = {**environment(context, case, cache_dir=cache_dir, mmlu_dir=mmlu_dir), **_AMBIENT}
    store_before, files_before = _check_store(case, context), folder_snapshot(folder)
    started = time.monotonic()
    done = run_cli(case.args, env=env, folder=folder, drop_prefix="POSBIAS_", timeout=timeout)
    seconds = time.monotonic() - started
    return Outcome(
        case=case,
        code=done.code,
        stdout=done.stdout,
        stderr=done.stderr,
        store_changed=_check_store(case, context) != store_before,
        files_changed=folder_snapshot(folder) != files_before,
        seconds=seconds,
    )


_AMBIENT = {"RAY_ADDRESS": "", "COLUMNS": "200"}
"""What both ways of running give a case besides its POSBIAS_* variables: no ambient Ray, a wide console."""


def run_subprocess(
    case: Case, context: Context, *, folder: Path, cache_dir: Path, mmlu_dir: Path, timeout: float = 90
) -> Outcome:
    """Run `case` as `python -m posbias.cli ...` in `folder`."""
    prepare(case, folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSBIAS_")}
    env.update(environment(context, case, cache_dir=cache_dir, mmlu_dir=mmlu_dir))
    # Nothing leaves this machine: the hub client, if anything reached it, would meet a closed port.
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_ENDPOINT": f"http://127.0.0.1:{context.closed_port}",
            **_AMBIENT,
        }
    )
    store_before, files_before = _check_store(case, context), folder_snapshot(folder)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "posbias.cli", *case.args],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        code: int | None = done.returncode
        stdout, stderr = done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
    seconds = time.monotonic() - started
    return Outcome(
        case=case,
        code=code,
        stdout=stdout,
        stderr=stderr,
        store_changed=_check_store(case, context) != store_before,
        files_changed=folder_snapshot(folder) != files_before,
        seconds=seconds,
    )


@dataclass
class ApiOutcome:
    """What the Python API did with a case's request (`Case.api`)."""

    case: Case
    error: BaseException | None
    """What it raised; None when it accepted the request."""
    cli_line: str
    """What the command printed for the same case (after `error: `, click's `(see ...)` hint dropped)."""

    @property
    def problems(self) -> list[str]:
        """Every broken promise: a request the command refuses accepted, an error that is not posbias's, a
        usage error raised as another kind, another line than the command's."""
        from posbias.schemas import PosbiasError, UsageError

        if self.error is None:
            return ["accepted by the API"]
        if not isinstance(self.error, PosbiasError):
            return [f"raised {type(self.error).__module__}.{type(self.error).__name__}"]
        if not self.case.same_text:
            return (
                []
                if isinstance(self.error, UsageError)
                else [f"{type(self.error).__name__}, not a usage error"]
            )
        said = " ".join(str(self.error).split())
        return [] if said == self.cli_line else [f"said {said[:300]!r}"]

    def report(self) -> str:
        """The case and what the two said, for a failure message."""
        return f"{self.case.describe()}: {', '.join(self.problems)}; the command said {self.cli_line[:300]!r}"


def run_api(
    case: Case, context: Context, *, folder: Path, cache_dir: Path, mmlu_dir: Path, cli: Outcome
) -> ApiOutcome:
    """Make `case.api`'s request of the Python API in `folder`, under the environment the command had (the
    settings read as `posbias.load_settings()` reads them), beside `cli`, the command's outcome."""
    import posbias
    from posbias.schemas.schedule import RegressionRule

    assert case.api is not None
    name, args, kwargs = case.api
    line = cli.lines[-1].removeprefix("error: ") if cli.lines else ""
    line = re.sub(r" \(see `posbias[^`]*--help`\)$", "", line)
    env = {**environment(context, case, cache_dir=cache_dir, mmlu_dir=mmlu_dir), **_AMBIENT}
    error: BaseException | None = None
    with _environment(env, drop_prefix="POSBIAS_"), contextlib.chdir(folder), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            settings = posbias.load_settings()
            if name != "load_settings":
                given = dict(kwargs)
                if name == "add_schedule":
                    given["source"] = posbias.FolderSource(path=Path(given.pop("folder")))
                    given["rule"] = RegressionRule(max_drop=given.pop("max_drop"))
                getattr(posbias, name)(*args, settings=settings, **given)
        except Exception as exc:
            error = exc
    return ApiOutcome(case=case, error=error, cli_line=line)


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A loopback TCP port that accepts connections and never says a word: not Ray, not PostgreSQL."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        server.close()


# --- the cases ------------------------------------------------------------------------------------------

Template = Callable[[random.Random, Context], Case]
TEMPLATES: dict[str, Template] = {}


def template(function: Template) -> Template:
    """Register a case template under its name."""
    TEMPLATES[function.__name__] = function
    return function


def generate(seed: int, context: Context, *, templates: list[str] | None = None) -> Iterator[Case]:
    """Cases without end, cycling through the templates (in an order the seed shuffles) so that any prefix
    of a few dozen covers every template."""
    rng = random.Random(seed)
    names = sorted(templates or TEMPLATES)
    if not context.store_sql:
        names = [name for name in names if name != "damaged_store"]
    while True:
        rng.shuffle(names)
        for name in names:
            yield TEMPLATES[name](rng, context)


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    result = json.loads(json.dumps(data))
    target = result
    parts = path.split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value
    return result


# (field, values that field must refuse); every value here is invalid, so a spec with it must fail.
BAD_FIELDS: list[tuple[str, list[Any]]] = [
    ("iterations", [0, -1, 1_000_001, 2**63, 2**64, 10**30, True, 1.5, "abc", None, [], {}, INF, NAN]),
    ("seed", [2**63, -(2**63), 10**40, True, 1.5, "x", INF]),
    ("priority", [2**31, -(2**31), 2**63, True, NAN]),
    ("max_attempts", [0, 101, True, 2**70]),
    ("shard_size", [0, 1_000_001, True, 2**64]),
    ("batch_sizes", [True, [], [0], [201], "1,a", "1,\u00b3", [True], "", 2**64, [[1]], {"a": 1}, "\u0663"]),
    ("model", ["", "   ", "x" * 501, "a\x00b", 5, None, []]),
    ("revision", ["", "r" * 201, "a\x00"]),
    ("tokenizer", ["", "t" * 5000]),
    ("engine.dtype", ["garbage", "", "FLOAT32 ", "int8"]),
    ("engine.tensor_parallel_size", [0, 65, 2**40, True]),
    ("engine.max_model_len", [0, 15, 2**31, 2**63]),
    ("engine.gpu_memory_utilization", [0, 1.5, INF, NAN]),
    ("engine.name", ["gpt", "", 3]),
    ("engine.extra", [{"k": [1]}, {"k": {"a": 1}}, "x", {"k": INF}]),
    ("sampling.temperature", [-0.1, INF, NAN, 101, "hot"]),
    ("sampling.top_p", [0, 1.1, NAN]),
    ("sampling.max_tokens", [0, 2**31, True]),
    ("sampling.seed", [-1, 2**63, True]),
    ("fake.first", [-0.1, 1.1, INF, NAN]),
    ("fake.delay_s", [INF, 61, -1]),
    ("design", ["spiral", ""]),
    ("answer_mode", ["free-ish"]),
    ("chat_template", ["maybe"]),
    ("shuffle_choices", ["perhaps", 2]),
    ("dataset.split", ["", "s" * 201]),
    ("dataset.subjects", [[""], ["s" * 201], "a,\x00"]),
    ("dataset.name", ["", "n" * 501]),
    ("dataset.path", ["", "p" * 5000]),
    ("dataset.question_column", [""]),
    ("dataset.choices_column", [""]),
    ("prompt.question", ["q" * 100_001]),
    ("prompt.separator", ["\x00"]),
    ("unknown_field", [1]),
    ("engine.unknown", [1]),
    ("fake.x", [1]),
    ("prompt", ["not a mapping"]),
    ("engine", [[1, 2]]),
    ("dataset", [5]),
]


def _spec_command(rng: random.Random, name: str) -> tuple[str, ...]:
    return rng.choice([("submit", name), ("submit", name, "--dry-run"), ("run", name)])


def _spec_api(command: tuple[str, ...]) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """The API's call for a spec command (`run` as `submit`: a run that is refused runs nothing either)."""
    name = "dry_run" if "--dry-run" in command else "submit"
    return name, (command[1],), {}


def _with_api(
    case: Case, call: tuple[str, tuple[Any, ...], dict[str, Any]], *, same_text: bool = True
) -> Case:
    return dataclasses.replace(case, api=call, same_text=same_text)


def _spec_case(template: str, command: tuple[str, ...], **fields: Any) -> Case:
    """A case of a spec command with the API's call for it."""
    return Case(template, command, api=_spec_api(command), **fields)


@template
def spec_field(rng: random.Random, context: Context) -> Case:
    """A spec file with one field set to a value the field must refuse."""
    path, values = rng.choice(BAD_FIELDS)
    spec = _set(VALID_SPEC, path, rng.choice(values))
    if rng.random() < 0.5:
        name, text = "job.json", json.dumps(spec)
    else:
        name, text = "job.yaml", yaml.safe_dump(spec, allow_unicode=rng.random() < 0.5)
    return _spec_case("spec_field", _spec_command(rng, name), files={name: text.encode()})


RAW_YAML = [
    "model: fake\nengine: {name: fake}\nbatch_sizes: [2]\niterations: 1:30\n",  # YAML 1.1 reads 90
    "model: fake\nengine: {name: fake}\nbatch_sizes: yes\niterations: 2\n",
    "model: fake\nengine: {name: fake}\nbatch_sizes: [2]\niterations: 0x\n",
    "model: fake\nengine: {name: fake}\nbatch_sizes: [2]\niterations: .inf\n",
    "model: [unclosed\n",
    "a: b: c\n",
    "\tmodel: fake\n",
    "- a\n- b\n",
    "42\n",
    "'just text'\n",
    "",
    "# only a comment\n",
    "model: fake\nmodel: fake\nbatchsize: 5\n",
    "model: !!python/object:os.system ls\n",
    "model: fake\nengine: {name: fake}\nbatch_sizes: [2]\niterations: 2\nseed: 99999999999999999999999\n",
]


@template
def spec_text(rng: random.Random, context: Context) -> Case:
    """A spec file whose text is not a valid spec: bad YAML or JSON, the wrong shape, YAML 1.1 numbers."""
    if rng.random() < 0.7:
        name, text = "job.yaml", rng.choice(RAW_YAML)
    else:
        name = "job.json"
        text = rng.choice(
            ["{", '{"model": }', "[1, 2]", "null", '{"model": "fake", "iterations": NaN, "batch_sizes": [2]}']
        )
    return _spec_case("spec_text", _spec_command(rng, name), files={name: text.encode()})


def _deep(kind: str, depth: int) -> str:
    if kind == "json":
        return '{"model": ' + "[" * depth + "]" * depth + "}"
    if kind == "flow":
        return "model: " + "[" * depth + "]" * depth + "\n"
    depth = min(depth, 700)  # indentation grows with depth: 700 levels is half a megabyte
    return "".join("  " * level + f"k{level}:\n" for level in range(depth)) + "  " * depth + "v: 1\n"


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)


@template
def spec_file(rng: random.Random, context: Context) -> Case:
    """A spec that is not a readable file: a folder, a FIFO, a device, too large, too deep, not UTF-8."""
    case = _spec_file(rng)
    return _with_api(case, _spec_api(case.args))


def _spec_file(rng: random.Random) -> Case:
    choice = rng.randrange(14)
    command = _spec_command(rng, "job.yaml")
    if choice == 0:
        return Case("spec_file", command, special=(("dir", "job.yaml", ""),))
    if choice == 1:
        return Case("spec_file", command, special=(("fifo", "job.yaml", ""),))
    if choice == 2:
        return Case("spec_file", _spec_command(rng, "/dev/zero"))
    if choice == 3:
        return Case("spec_file", command, special=(("symlink", "job.yaml", "/dev/zero"),))
    if choice == 4:
        return Case("spec_file", command, files={"job.yaml": b"# padding\n" * 220_000})
    if choice == 5:
        kind = rng.choice(["json", "flow", "block"])
        name = "job.json" if kind == "json" else "job.yaml"
        depth = rng.choice([20, 100, 1200, 5000])
        return Case("spec_file", _spec_command(rng, name), files={name: _deep(kind, depth).encode()})
    if choice == 6:
        return Case("spec_file", command, files={"job.yaml": ALIAS_BOMB.encode()})
    if choice == 7:
        return Case("spec_file", command, files={"job.yaml": "model: caf\u00e9\n".encode("latin-1")})
    if choice == 8:
        return Case("spec_file", command, files={"job.yaml": "model: fake\n".encode("utf-16")})
    if choice == 9:
        return Case("spec_file", command, files={"job.yaml": b"\xff" + rng.randbytes(200)})
    if choice == 10:
        return Case("spec_file", command, files={"job.yaml": b"model: a\x00b\n"})
    if choice == 11:
        return Case("spec_file", _spec_command(rng, "missing.yaml"))
    if choice == 12:
        return Case("spec_file", _spec_command(rng, "no/such/folder/job.yaml"))
    return Case("spec_file", command, special=(("symlink", "job.yaml", "nowhere.yaml"),))


BAD_FLAGS: list[tuple[str, list[str]]] = [
    ("--iterations", ["0", "-5", "1000001", str(2**64), "abc", "1e3", "\u00b3", "", "1.5"]),
    ("--seed", [str(2**64), str(-(2**64)), "x"]),
    ("--priority", [str(2**31), str(2**63), "-" + str(2**31)]),
    ("--tensor-parallel-size", ["0", "65", str(2**70)]),
    ("--max-model-len", ["1", str(2**31)]),
    ("--dtype", ["garbage", "", "int4"]),
    ("--fake-first", ["inf", "nan", "-1", "2", "-inf"]),
    ("--fake-last", ["1.01", "nan"]),
    ("--fake-malformed", ["1.5", "inf"]),
    ("--batch-sizes", ["0", "201", "a", "1,,x", "", "1;2", "\u00b3", " ", "-1", str(2**64)]),
    ("--design", ["spiral"]),
    ("--answer-mode", ["x"]),
    ("--chat-template", ["sometimes"]),
    ("--engine", ["gpt", ""]),
    ("--idempotency-key", ["k" * 201, " "]),
    ("--dataset", ["./missing.csv", "missing/data.jsonl", "/no/such/dir", "data dir/file.txt", "./nodir/"]),
    ("--subjects", ["astrology", "anatomy,astrology"]),
    ("--split", ["nosuch", ""]),
    ("--frobnicate", ["1"]),
]


@template
def submit_flag(rng: random.Random, context: Context) -> Case:
    """`submit` or `run` of the fake engine with one flag that must be refused."""
    flag, values = rng.choice(BAD_FLAGS)
    value = rng.choice(values)
    command = rng.choice(["submit", "run"])
    if flag == "--engine":  # without the fake engine, a real model is needed: give one that is missing
        return Case("submit_flag", (command, "--model", "./no/model", flag, value, "--batch-sizes", "2"))
    return Case("submit_flag", (command, *FAKE, flag, value))


@template
def submit_size(rng: random.Random, context: Context) -> Case:
    """A job too large to plan, a pool too small, a model that is not there, no model at all."""
    choice = rng.randrange(8)
    if choice == 0:
        args: tuple[str, ...] = (
            "submit",
            "--engine",
            "fake",
            "--batch-sizes",
            "1,2",
            "--iterations",
            "1000000",
        )
    elif choice == 1:
        args = (
            "run",
            "--engine",
            "fake",
            "--design",
            "rotation",
            "--batch-sizes",
            "200",
            "--iterations",
            "10000",
        )
    elif choice == 2:
        return Case(
            "submit_size",
            ("submit", "--engine", "fake", "--batch-sizes", "3", "--iterations", "11"),
            env={"POSBIAS_MAX_TRIALS": "10"},
        )
    elif choice == 3:
        args = ("submit", "--engine", "fake", "--batch-sizes", "6", "--subjects", "anatomy", "--split", "dev")
    elif choice == 4:
        args = ("submit", "--model", rng.choice(["./no/such/model", "missing.gguf", "/no/where"]))
    elif choice == 5:
        args = ("submit", "--batch-sizes", "2")
    elif choice == 6:
        args = ("submit", "--model", rng.choice(["", "   ", "x" * 501]), "--engine", "fake")
    else:
        args = ("run",)
    return Case("submit_size", args)


BAD_IDS = [str(2**63), str(2**64), str(10**30), "-1", "0", "abc", "1.5", "\u00b3", "1e3", ""]
# Ids Python's `int` reads (a full-width 2, an Arabic-Indic 3, `1_0`, ` 1`, `+1`): ASCII digits only.
BAD_IDS += ["\uff12", "\u0663", "1_0", " 1", "+1"]


@template
def job_id(rng: random.Random, context: Context) -> Case:
    """Job ids, limits and batch sizes that are not numbers, out of range, or name nothing."""
    bad = rng.choice([*BAD_IDS, "999"])
    value: Any = int(bad) if re.fullmatch(r"-?[0-9]+", bad) else bad
    flags = bad != "999"  # the command's flags refuse every bad id but one that names no job
    choice = rng.randrange(9)
    if choice == 0:
        return Case("job_id", ("status", bad), api=("job", (value,), {}), same_text=not flags)
    if choice == 1:
        return Case("job_id", ("cancel", bad), api=("cancel", (value,), {}), same_text=not flags)
    if choice == 2:
        given = rng.choice([bad, str(context.job_id)])
        number: Any = int(given) if re.fullmatch(r"-?[0-9]+", given) else given
        same = given in {"999", str(context.job_id)}
        return Case("job_id", ("retry", given), api=("retry", (number,), {}), same_text=same)
    if choice == 3:
        call = ("export_results", (value,), {"out": "x.csv"})
        return Case("job_id", ("export", bad, "--out", "x.csv"), api=call, same_text=not flags)
    if choice == 4:
        operands = ["\u00b3", "\uff12", "99999999999999999999", "0", "nobody", "999"]
        pair = [rng.choice(operands) for _ in range(2)]
        return Case("job_id", ("compare", *pair))
    if choice == 5:
        flag, values = rng.choice(
            [
                ("--job", ["0", str(2**64), "999", "x", "\uff12", "1_0"]),
                ("--batch-size", ["0", "201", "-3"]),
                ("--bin-width", ["0", "-1"]),
                ("--model", ["nobody", "\u00b3"]),
                ("--format", ["xml"]),
                ("--by", ["nonsense"]),
            ]
        )
        extra = () if flag in {"--job", "--model"} else ("--model", "nobody")
        return Case("job_id", ("curve", flag, rng.choice(values), *extra))
    if choice == 6:
        limit = rng.choice(["0", "-1", str(2**64), "10000001", "x"])
        call = ("jobs", (), {"limit": int(limit) if limit != "x" else limit})
        return Case("job_id", ("status", "--limit", limit), api=call, same_text=False)
    if choice == 7:
        return Case("job_id", ("worker", "--max-jobs", rng.choice(["0", "-1", str(2**64)])))
    return Case(
        "job_id", rng.choice([("curve",), ("export", str(context.job_id)), ("models", "x"), ("nosuch",)])
    )


def _url_cases(context: Context) -> list[tuple[str, tuple[tuple[str, str, str], ...]]]:
    closed = context.closed_port
    urls: list[tuple[str, tuple[tuple[str, str, str], ...]]] = [
        (f"postgresql+psycopg2://u@127.0.0.1:{closed}/db", ()),
        (f"postgresql+asyncpg://u@127.0.0.1:{closed}/db", ()),
        (f"postgresql+pg8000://u@127.0.0.1:{closed}/db", ()),
        ("mysql://root@127.0.0.1/posbias", ()),
        ("oracle://u@127.0.0.1/x", ()),
        ("sqlite+aiosqlite:///x.db", ()),
        ("", ()),
        ("   ", ()),
        ("not a url", ()),
        ("://", ()),
        ("postgresql://u@127.0.0.1:0/db", ()),
        ("postgresql://u@127.0.0.1:65536/db", ()),
        ("postgresql://u@127.0.0.1:99999/db", ()),
        ("postgresql://u@127.0.0.1:abc/db", ()),
        ("postgresql://u@127.0.0.1:-1/db", ()),
        (f"postgresql://u@127.0.0.1:{closed}/db", ()),
        (f"postgresql://u:secret@127.0.0.1:{closed}/db?sslmode=nonsense", ()),
        ("postgresql://u@127.0.0.1/", ()),
        ("sqlite:////no/such/dir/x.db", ()),
        ("sqlite:///./missing.db", ()),
        ("sqlite:///adir", (("dir", "adir", ""),)),
        ("sqlite:///garbage.db", ()),
        (
            "sqlite:///foreign.db",
            (("sqlite", "foreign.db", "CREATE TABLE invoices (id INTEGER, total REAL);"),),
        ),
        (
            "sqlite:///future.db",
            (
                (
                    "sqlite",
                    "future.db",
                    "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY);"
                    "INSERT INTO alembic_version VALUES ('f00dfeed9999');",
                ),
            ),
        ),
    ]
    if context.postgres_port is not None:
        port = context.postgres_port
        urls += [
            (f"postgresql://posbias@127.0.0.1:{port}/no_such_database", ()),
            (f"postgresql://nobody@127.0.0.1:{port}/postgres", ()),
        ]
    if context.foreign_postgres_url is not None:
        urls.append((context.foreign_postgres_url, ()))
    return urls


@template
def database_url(rng: random.Random, context: Context) -> Case:
    """A store URL that is malformed, names a driver posbias does not use, or a store that is not posbias's
    (missing, empty, damaged, another application's, migrated by a newer posbias)."""
    url, special = rng.choice(_url_cases(context))
    files = {"garbage.db": b"not a database " * 100} if "garbage" in url else {}
    commands: list[tuple[str, ...]] = [
        ("status",),
        ("models",),
        ("curve", "--model", "x"),
        ("submit", *FAKE),
        ("export", "1", "--out", "out.csv"),
        ("schedule", "list"),
    ]
    local_store = special and special[0][0] == "sqlite"
    if not local_store and "foreign" not in url:
        commands.append(("db", "current"))
    if local_store or "foreign" in url or "garbage" in url or "adir" in url:
        commands.append(("db", "upgrade"))
    case_env = {"POSBIAS_DATABASE_URL": url}
    command = rng.choice(commands)
    return Case(
        "database_url", command, env=case_env, files=files, special=special, api=_command_api(command)
    )


def _command_api(command: tuple[str, ...]) -> tuple[str, tuple[Any, ...], dict[str, Any]] | None:
    """The API's call for one of the commands the store and settings templates run."""
    calls: dict[tuple[str, ...], tuple[str, tuple[Any, ...], dict[str, Any]]] = {
        ("status",): ("jobs", (), {}),
        ("models",): ("models", (), {}),
        ("curve", "--model", "x"): ("curves", ("x",), {}),
        ("submit", *FAKE): ("submit", (dict(VALID_SPEC),), {}),
        ("export", "1", "--out", "out.csv"): ("export_results", (1,), {"out": "out.csv"}),
        ("schedule", "list"): ("list_schedules", (), {}),
        ("db", "current"): ("store_version", (), {}),
        ("db", "upgrade"): ("upgrade_store", (), {}),
    }
    return calls.get(command)


@template
def revision(rng: random.Random, context: Context) -> Case:
    """Alembic revisions that do not exist."""
    rev = rng.choice(["nosuch", "f00dfeed", "+99", "-99", "ffff:head"])
    command = rng.choice([("db", "upgrade", rev), ("db", "downgrade", rev), ("db", "downgrade")])
    calls = {"upgrade": "upgrade_store", "downgrade": "downgrade_store"}
    api = (calls[command[1]], (rev,), {}) if len(command) == 3 else None
    # `-99` reads as an option to the command's parser: it refuses it as one.
    return Case("revision", command, api=api, same_text=not rev.startswith("-"))


BAD_SETTINGS: list[tuple[str, list[str]]] = [
    ("POSBIAS_LEASE_SECONDS", ["inf", "nan", "-1", "0", "1e400", "abc", "", "100000"]),
    ("POSBIAS_HEARTBEAT_SECONDS", ["0", "-1", "inf", "3601"]),
    ("POSBIAS_POLL_SECONDS", ["0", "inf", "-0.5"]),
    ("POSBIAS_DRAIN_SECONDS", ["-1", "nan"]),
    ("POSBIAS_STORE_OUTAGE_SECONDS", ["0", "inf"]),
    ("POSBIAS_RAY_CONNECT_SECONDS", ["0", "inf", "-3"]),
    ("POSBIAS_MAX_TRIALS", ["0", "1e3", "100000001", str(2**70)]),
    ("POSBIAS_CPU_KVCACHE_GIB", ["0", str(10**30), "two"]),
    ("POSBIAS_CPU_THREADS", ["0", "-2"]),
    ("POSBIAS_ACTORS_PER_MODEL", ["0", str(2**40)]),
    ("POSBIAS_WORKER_ID", ["", "w" * 201]),
    ("POSBIAS_DEBUG", ["maybe", "2"]),
    ("POSBIAS_WEBHOOK_URL", ["x" * 5000, "ftp://example.com/hook", "file:///etc/passwd", "http:///hook"]),
    ("POSBIAS_RAY_ADDRESS", [""]),
]


@template
def setting(rng: random.Random, context: Context) -> Case:
    """A POSBIAS_* variable with a value its setting must refuse."""
    name, values = rng.choice(BAD_SETTINGS)
    command = rng.choice([("status",), ("models",), ("submit", *FAKE), ("db", "current")])
    return Case("setting", command, env={name: rng.choice(values)}, api=_command_api(command))


@template
def env_file(rng: random.Random, context: Context) -> Case:
    """A `.env` in the working folder that cannot be read as settings."""
    choice = rng.randrange(9)
    command = rng.choice([("status",), ("db", "current"), ("submit", *FAKE), ("curve", "--model", "x")])
    files: dict[str, bytes] = {}
    special: tuple[tuple[str, str, str], ...] = ()
    if choice == 0:
        files[".env"] = b"POSBIAS_LEASE_SECONDS=30\nNAME=caf\xe9\n"
    elif choice == 1:
        special = (("dir", ".env", ""),)
    elif choice == 2:
        special = (("fifo", ".env", ""),)
    elif choice == 3:
        files[".env"] = b"A=1\x00\n"
    elif choice == 4:
        files[".env"] = b"A B=c\n"
    elif choice == 5:
        files[".env"] = b"# x\n" * 300_000
    elif choice == 6:
        files[".env"] = b"POSBIAS_LEASE_SECONDS=inf\n"
    elif choice == 7:
        special = (("symlink", ".env", "/dev/zero"),)
    else:
        files[".env"] = b'A="unclosed\n'
    return Case("env_file", command, files=files, special=special, api=("load_settings", (), {}))


def _json_rows(rows: Any) -> bytes:
    return json.dumps(rows).encode()


BAD_DATASETS: list[tuple[str, bytes]] = [
    ("data.csv", b"a,b\n1,2\n"),
    ("data.csv", b"question,choices,answer\nq,notalist,0\n"),
    ("data.csv", b'question,choices,answer\nq,"[""a"",""b""]",2\n'),
    ("data.csv", b'question,choices,answer\nq,"[""a"",""b""]",E\n'),
    ("data.csv", 'question,choices,answer\nq,"[""a"",""b""]",\u00b3\n'.encode()),
    ("data.csv", b"question,choices,answer\ncaf\xe9,x,0\n"),
    ("data.json", _json_rows({"data": [{"question": "q", "choices": {"A": {"x": 1}}, "answer": "A"}]})),
    ("data.json", _json_rows([{"question": "q", "choices": 5, "answer": 0}])),
    ("data.json", _json_rows([{"question": "q", "choices": [[1, 2], [3]], "answer": 0}])),
    (
        "data.json",
        _json_rows([{"question": "q", "choices": {"label": ["A", "B"], "text": ["x"]}, "answer": "A"}]),
    ),
    (
        "data.json",
        _json_rows([{"question": "q", "choices": {"label": ["A", "B"], "text": ["x", "y"]}, "answer": "C"}]),
    ),
    ("data.json", _json_rows([{"question": "q", "choices": {"A": "x", "B": "y"}, "answer": 0}])),
    ("data.json", _json_rows([{"question": "q", "choices": {"A": "x", "B": "y"}, "answer": "Z"}])),
    ("data.json", _json_rows([{"question": "q", "choices": {"one": 1, "two": [2]}, "answer": "one"}])),
    ("data.json", _json_rows([{"question": 5, "choices": ["a", "b"], "answer": 0}])),
    ("data.json", _json_rows([{"question": "q\u0000", "choices": ["a", "b"], "answer": 0}])),
    ("data.json", _json_rows([{"question": "q", "choices": ["a", "b"], "answer": 0, "subject": "s" * 201}])),
    ("data.json", _json_rows([{"question": "q", "choices": ["a"], "answer": 0}])),
    ("data.json", _json_rows([])),
    ("data.json", _json_rows({"a": 1})),
    ("data.json", ("[" * 3000 + "]" * 3000).encode()),
    ("data.json", b"{"),
    ("data.jsonl", b'{"question": "q", "choices": ["a", "b"], "answer": 0}\n[1, 2]\n'),
    ("data.jsonl", b"{not json}\n"),
    ("data.parquet", b"PAR1 this is not parquet"),
    ("data.txt", b"question,choices,answer\n"),
    ("data.csv", b""),
]


@template
def dataset(rng: random.Random, context: Context) -> Case:
    """A local dataset file in a layout posbias must refuse (naming the file, row and column)."""
    command = rng.choice(["submit", "run"])
    choice = rng.randrange(len(BAD_DATASETS) + 3)
    args = (command, "--engine", "fake", "--batch-sizes", "1", "--iterations", "1", "--dataset")
    if choice == len(BAD_DATASETS):
        return _dataset_case(Case("dataset", (*args, "./data.csv"), special=(("fifo", "data.csv", ""),)))
    if choice == len(BAD_DATASETS) + 1:
        return _dataset_case(Case("dataset", (*args, "./data.csv"), special=(("dir", "data.csv", ""),)))
    if choice == len(BAD_DATASETS) + 2:
        return _dataset_case(Case("dataset", (*args, "./somefolder"), special=(("dir", "somefolder", ""),)))
    name, content = BAD_DATASETS[choice]
    return _dataset_case(Case("dataset", (*args, f"./{name}"), files={name: content}))


def _dataset_case(case: Case) -> Case:
    spec = {**VALID_SPEC, "batch_sizes": [1], "iterations": 1, "dataset": {"path": case.args[-1]}}
    return _with_api(case, ("submit", (spec,), {}))


@template
def export(rng: random.Random, context: Context) -> Case:
    """An export to somewhere it cannot or must not write."""
    job = str(context.job_id)
    choice = rng.randrange(9)
    if choice == 0:
        return Case("export", ("export", job, "--out", "missing/x.csv"))
    if choice == 1:
        return Case("export", ("export", job, "--out", "adir.csv"), special=(("dir", "adir.csv", ""),))
    if choice == 2:
        return Case("export", ("export", job, "--out", "old.csv"), files={"old.csv": b"keep me\n"})
    if choice == 3:
        return Case("export", ("export", job, "--out", rng.choice(["x.xlsx", "x", "x.CSV.gz"])))
    if choice == 4:
        return Case("export", ("export", job, "--out", "x.csv", "--format", "xml"))
    if choice == 5:
        return Case(
            "export", ("export", job, "--out", "/dev/full", "--format", rng.choice(["csv", "parquet"]))
        )
    if choice == 6:
        return Case("export", ("export", "999", "--out", "new.csv"))
    if choice == 7:
        return Case("export", ("export", job, "--out", "sock.csv"), special=(("socket", "sock.csv", ""),))
    return Case(
        "export", ("export", job, "--out", "link.csv"), special=(("symlink", "link.csv", "nodir/x.csv"),)
    )


INLINE = '{"engine": {"name": "fake"}, "batch_sizes": [2], "iterations": 2}'


@template
def schedule(rng: random.Random, context: Context) -> Case:
    """Schedules with a bad name, template, source, rule or baseline, and schedules that do not exist."""
    good = ("--spec", INLINE, "--folder", "ckpts", "--max-drop", "5")
    folder = (("dir", "ckpts", ""),)
    choice = rng.randrange(10)
    if choice == 0:
        name = rng.choice(["-bad", "x" * 65, "a b", "\u00fc", "", "."])
        return Case("schedule", ("schedule", "add", name, *good), special=folder)
    if choice == 1:
        text = rng.choice(["{", '{"a": ' + "[" * 3000, '{"iterations": 0}', '{"nope": 1}', "[1]"])
        call = ("add_schedule", ("s1",), {"spec": text, "folder": "ckpts", "max_drop": 5})
        return Case(
            "schedule",
            ("schedule", "add", "s1", "--spec", text, "--folder", "ckpts", "--max-drop", "5"),
            special=folder,
            api=call,
        )
    if choice == 2:
        content = rng.choice([b"\xff\xfe", b"model: [", ALIAS_BOMB.encode(), b"iterations: 1:30\n"])
        return Case(
            "schedule",
            ("schedule", "add", "s1", "--spec", "t.yaml", "--folder", "ckpts", "--max-drop", "5"),
            files={"t.yaml": content},
            special=folder,
        )
    if choice == 3:
        return Case(
            "schedule",
            ("schedule", "add", "s1", "--spec", "t.yaml", "--folder", "ckpts", "--max-drop", "5"),
            special=(*folder, ("fifo", "t.yaml", "")),
        )
    if choice == 4:
        return Case(
            "schedule", ("schedule", "add", "s1", "--spec", INLINE, "--folder", "nowhere", "--max-drop", "5")
        )
    if choice == 5:
        source = rng.choice([("--hub", "not a repo!!"), ("--hub", "a/b", "--folder", "ckpts"), ()])
        return Case(
            "schedule",
            ("schedule", "add", "s1", "--spec", INLINE, *source, "--max-drop", "5"),
            special=folder,
        )
    if choice == 6:
        flag, value = rng.choice(
            [
                ("--max-drop", "inf"),
                ("--max-drop", "nan"),
                ("--max-drop", "-1"),
                ("--max-drop", "101"),
                ("--max-ratio-drop", "inf"),
                ("--confidence", "2"),
                ("--confidence", "nan"),
            ]
        )
        return Case(
            "schedule",
            ("schedule", "add", "s1", "--spec", INLINE, "--folder", "ckpts", flag, value),
            special=folder,
        )
    if choice == 7:
        baseline = rng.choice(["\u00b3", "99999999999999999999999", "-1", "last", "999"])
        return Case("schedule", ("schedule", "add", "s1", *good, "--baseline", baseline), special=folder)
    if choice == 8:
        verb = rng.choice(["show", "remove", "pause", "resume", "report", "tick"])
        calls = {
            "show": "schedule",
            "remove": "remove_schedule",
            "pause": "pause_schedule",
            "resume": "resume_schedule",
            "report": "schedule_report",
            "tick": "tick_schedules",
        }
        return Case("schedule", ("schedule", verb, "nosuch"), api=(calls[verb], ("nosuch",), {}))
    return Case("schedule", ("schedule", "report", "nosuch", "--batch-size", rng.choice(["0", "201"])))


@template
def ray_address(rng: random.Random, context: Context) -> Case:
    """Ray addresses nothing answers at, or that are not addresses; `run` must check Ray before it
    submits. Real processes: the test's process may hold a Ray of its own (the session's), which the API
    then uses whatever the address, and an address that never answers leaves `ray.init` in a thread."""
    choice = rng.randrange(7)
    closed = context.closed_port
    if choice == 0:
        args: tuple[str, ...] = ("worker", "--ray-address", f"127.0.0.1:{closed}")
        return Case("ray_address", args, in_process=False)
    if choice == 1:
        return Case("ray_address", ("worker", "--ray-address", f"ray://127.0.0.1:{closed}"), in_process=False)
    if choice == 2:
        address = rng.choice(["garbage", "127.0.0.1:99999", ""])
        return Case("ray_address", ("worker", "--ray-address", address), in_process=False)
    if choice == 3:
        return Case(
            "ray_address",
            ("worker", "--until-empty", "--ray-address", f"127.0.0.1:{context.silent_port}"),
            env={"POSBIAS_RAY_CONNECT_SECONDS": "2"},
            in_process=False,
        )
    if choice == 4:
        env = {"POSBIAS_RAY_ADDRESS": f"127.0.0.1:{closed}"}
        return Case("ray_address", ("run", *FAKE), env=env, in_process=False)
    if choice == 5:
        return Case(
            "ray_address",
            ("run", *FAKE),
            env={
                "POSBIAS_RAY_ADDRESS": f"127.0.0.1:{context.silent_port}",
                "POSBIAS_RAY_CONNECT_SECONDS": "2",
            },
            in_process=False,
        )
    env = {"POSBIAS_RAY_ADDRESS": f"ray://127.0.0.1:{closed}"}
    return Case("ray_address", ("worker", "--json"), env=env, in_process=False)


SERVED_URLS = [
    "http://127.0.0.1:99999/v1",
    "http://127.0.0.1:65536/v1",
    "http://127.0.0.1:0/v1",
    "http://127.0.0.1:abc/v1",
    "http://127.0.0.1:-1/v1",
    "http://127.0.0.1:8000/v1\r\nX-Injected: 1",
    "http://127.0.0.1:8000/v1\n",
    "http://127.0.0.1:8000/v\t1",
    "http://127.0.0.1 :8000/v1",
    "http://[::1/v1",
    "ftp://127.0.0.1:8000/v1",
    "127.0.0.1:8000",
    "",
]


@template
def served_url(rng: random.Random, context: Context) -> Case:
    """An OpenAI-compatible endpoint's `base_url` with a port out of range or not a number, a CR/LF or a
    tab in it, no scheme or the wrong one: in a spec file, or as a flag."""
    url = rng.choice(SERVED_URLS)
    if rng.random() < 0.5 and "\n" not in url and "\r" not in url and "\t" not in url:
        args = ("submit", "--model", "m", "--engine", "openai", "--base-url", url, "--dry-run")
        return Case("served_url", (*args, "--batch-sizes", "1", "--iterations", "2"))
    spec = {"model": "m", "engine": {"name": "openai", "base_url": url}, "batch_sizes": [1], "iterations": 2}
    name = rng.choice(["job.json", "job.yaml"])
    text = json.dumps(spec) if name.endswith(".json") else yaml.safe_dump(spec)
    return _spec_case("served_url", _spec_command(rng, name), files={name: text.encode()})


CONTROL = ["\n", "\r", "\r\n", "\t", "\x1b", "\x7f"]


@template
def control_path(rng: random.Random, context: Context) -> Case:
    """A control character (CR, LF, tab, escape) in a path or a URL: the dataset, the filler source, a model
    folder, the spec file's own name, the store's URL."""
    char = rng.choice(CONTROL)
    choice = rng.randrange(5)
    if choice == 4:
        url = rng.choice(
            [f"sqlite:///store.db{char}", f"sqlite:///st{char}ore.db", f"{context.store_url}{char}"]
        )
        command = rng.choice([("status",), ("db", "current"), ("db", "upgrade"), ("submit", *FAKE)])
        return Case("control_path", command, env={"POSBIAS_DATABASE_URL": url}, api=_command_api(command))
    if choice == 3:
        name = f"job{char}.yaml"
        text = yaml.safe_dump(VALID_SPEC).encode()
        return _spec_case("control_path", _spec_command(rng, name), files={name: text})
    files = {"q.csv": b"question,choices,answer\n", "f.txt": b"Some words here. More words there.\n"}
    spec: dict[str, Any] = dict(VALID_SPEC)
    if choice == 0:
        spec["dataset"] = {"name": "mine", "path": f"q.csv{char}"}
    elif choice == 1:
        spec["filler"] = {"tokens": [10], "source": f"f{char}.txt"}
    else:
        spec = {"model": f"./m{char}", "batch_sizes": [1], "iterations": 1}
    name = "job.yaml"
    return _spec_case(
        "control_path", _spec_command(rng, name), files={**files, name: yaml.safe_dump(spec).encode()}
    )


@template
def symlink_loop(rng: random.Random, context: Context) -> Case:
    """A symbolic link that points at itself (through another): as `.env`, the spec file, the dataset, the
    filler source, the model folder."""
    loop = (("symlink", "a", "b"), ("symlink", "b", "a"))
    choice = rng.randrange(5)
    if choice == 0:
        command = rng.choice([("status",), ("db", "current"), ("submit", *FAKE)])
        return Case(
            "symlink_loop", command, special=(*loop, ("symlink", ".env", "a")), api=_command_api(command)
        )
    if choice == 1:
        return _spec_case(
            "symlink_loop", _spec_command(rng, "job.yaml"), special=(*loop, ("symlink", "job.yaml", "a"))
        )
    if choice == 2:
        args = (
            "submit",
            "--engine",
            "fake",
            "--batch-sizes",
            "1",
            "--iterations",
            "1",
            "--dataset",
            "./data.csv",
        )
        return _dataset_case(Case("symlink_loop", args, special=(*loop, ("symlink", "data.csv", "a"))))
    if choice == 3:
        spec = {**VALID_SPEC, "filler": {"tokens": [10], "source": "f.txt"}}
        return _spec_case(
            "symlink_loop",
            _spec_command(rng, "job.yaml"),
            files={"job.yaml": yaml.safe_dump(spec).encode()},
            special=(*loop, ("symlink", "f.txt", "a")),
        )
    spec = {"model": "./m", "batch_sizes": [1], "iterations": 1}
    return _spec_case(
        "symlink_loop",
        _spec_command(rng, "job.yaml"),
        files={"job.yaml": yaml.safe_dump(spec).encode()},
        special=(*loop, ("symlink", "m", "a")),
    )


CONFIG = json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}).encode()


@template
def special_file(rng: random.Random, context: Context) -> Case:
    """A FIFO, a socket or a device where posbias reads a file: the filler source, a model folder's
    `config.json`, a dataset, the spec file (a device), a spec template."""
    choice = rng.randrange(6)
    kind = rng.choice(["fifo", "socket"])
    if choice == 0:
        spec = {**VALID_SPEC, "filler": {"tokens": [10], "source": "f.txt"}}
        return _spec_case(
            "special_file",
            _spec_command(rng, "job.yaml"),
            files={"job.yaml": yaml.safe_dump(spec).encode()},
            special=((kind, "f.txt", ""),),
        )
    if choice == 1:
        spec = {**VALID_SPEC, "filler": {"tokens": [10], "source": rng.choice(["/dev/zero", "/dev/null"])}}
        return _spec_case(
            "special_file", _spec_command(rng, "job.yaml"), files={"job.yaml": yaml.safe_dump(spec).encode()}
        )
    if choice == 2:
        spec = {"model": "./m", "batch_sizes": [1], "iterations": 1}
        return _spec_case(
            "special_file",
            ("submit", "job.yaml", "--dry-run"),
            files={"job.yaml": yaml.safe_dump(spec).encode(), "m/tokenizer.json": b"{}"},
            special=((kind, "m/config.json", ""),),
        )
    if choice == 3:
        args = (
            "submit",
            "--engine",
            "fake",
            "--batch-sizes",
            "1",
            "--iterations",
            "1",
            "--dataset",
            "./data.jsonl",
        )
        return _dataset_case(Case("special_file", args, special=((kind, "data.jsonl", ""),)))
    if choice == 4:
        return _spec_case(
            "special_file", _spec_command(rng, rng.choice(["/dev/null", "/dev/tty", "/dev/urandom"]))
        )
    call = ("add_schedule", ("s1",), {"spec": "t.json", "folder": "ckpts", "max_drop": 5})
    return Case(
        "special_file",
        ("schedule", "add", "s1", "--spec", "t.json", "--folder", "ckpts", "--max-drop", "5"),
        special=(("dir", "ckpts", ""), (kind, "t.json", "")),
        api=call,
    )


STORE_DAMAGE = [
    (
        "not_json",
        "UPDATE jobs SET spec = 'not json';",
        [("status",), ("status", "1"), ("curve", "--job", "1")],
    ),
    ("not_json", "UPDATE jobs SET spec = '{\"model\": ';", [("status",), ("export", "1", "--out", "x.csv")]),
    ("dropped", "DROP TABLE curve_points;", [("db", "upgrade")]),
    ("dropped", "DROP VIEW IF EXISTS position_curve; DROP TABLE results;", [("db", "upgrade")]),
    ("dropped", "DROP TABLE checkpoints; DROP TABLE schedules;", [("db", "upgrade")]),
    ("unversioned", "DROP TABLE alembic_version;", [("db", "upgrade")]),
    ("variants", "", [("db", "downgrade", "base"), ("db", "downgrade", "0005")]),
]
"""(what, SQL that damages the store, commands that must refuse it)."""


@template
def damaged_store(rng: random.Random, context: Context) -> Case:
    """A posbias SQLite store (WAL, as posbias makes them) damaged or in a state a command must refuse: a
    stored spec that is not JSON, a table dropped, posbias's tables without a revision, a downgrade the
    migrations refuse (a job with variants). Nothing must change, and no `-wal`/`-shm` file stay beside it."""
    _what, damage, commands = rng.choice(STORE_DAMAGE)
    command = rng.choice(commands)
    sql = context.store_sql + damage + "\nPRAGMA journal_mode = WAL;\n"
    api: tuple[str, tuple[Any, ...], dict[str, Any]] | None = _command_api(command)
    if command[:2] == ("db", "downgrade"):
        api = ("downgrade_store", (command[2],), {})
    elif command == ("status", "1"):
        api = ("job", (1,), {})
    return Case(
        "damaged_store",
        command,
        env={"POSBIAS_DATABASE_URL": "sqlite:///store.db"},
        special=(("sqlite", "store.db", sql),),
        api=api,
    )


@functools.cache
def store_sql(mmlu_dir: Path) -> str:
    """SQL that recreates a small posbias SQLite store at the newest revision: one fake job with a variant
    (what `db downgrade` below 0007 refuses), as `iterdump` writes it."""
    import tempfile

    import posbias.api as api
    from posbias.service.settings import Settings
    from posbias.service.store import migrate

    with tempfile.TemporaryDirectory(prefix="posbias-fuzz-store-") as folder:
        url = f"sqlite:///{folder}/store.db"
        migrate.upgrade(url)
        settings = Settings(database_url=url, mmlu_dir=mmlu_dir, cache_dir=Path(folder) / "cache")
        spec = {**VALID_SPEC, "variants": [{"name": "worse", "fake": {"last": 0.4}}]}
        api.submit(spec, settings=settings)
        connection = sqlite3.connect(f"{folder}/store.db")
        try:
            return "\n".join(connection.iterdump()) + "\n"
        finally:
            connection.close()


# --- a store to run against -----------------------------------------------------------------------------


def prepare_store(url: str, *, mmlu_dir: Path, cache_dir: Path) -> int:
    """Migrate the store at `url` and submit one small fake-engine job (queued, no results); its id."""
    import posbias.api as api
    from posbias.service.settings import Settings
    from posbias.service.store import migrate

    migrate.upgrade(url)
    settings = Settings(database_url=url, mmlu_dir=mmlu_dir, cache_dir=cache_dir)
    return api.submit(dict(VALID_SPEC), settings=settings).job_id


def foreign_postgres(server: Any, name: str) -> str:
    """A database on `server` (a `support.postgres.PostgresServer`) holding another application's table."""
    import psycopg

    url: str = server.create_database(name)
    with psycopg.connect(
        host=server.host, port=server.port, user="posbias", dbname=name, autocommit=True
    ) as c:
        c.execute("CREATE TABLE invoices (id integer PRIMARY KEY, total numeric)")
        c.execute("INSERT INTO invoices VALUES (1, 9.5)")
    return url
