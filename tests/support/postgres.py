"""A throwaway PostgreSQL server in a temporary folder, for the integration tests and the store benchmark.

It needs the server binaries (`initdb`, `pg_ctl`; found with `pg_config --bindir`). PostgreSQL refuses to
run as root, so under root the server runs as the `postgres` system user (created by the Debian/Ubuntu
packages; `useradd --system postgres` otherwise). The server listens on 127.0.0.1 on a free port with trust
authentication, and everything is deleted when it stops.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from posbias.schemas import PosbiasError
from support.ports import free_port

SUPERUSER = "posbias"
START_ATTEMPTS = 3  # a free port can be taken by someone else between finding it and binding it

# Durability off: a test server is deleted after the run, so crash safety buys nothing and costs fsyncs.
FAST_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


@dataclass
class PostgresServer:
    """A running throwaway server. `stop()` shuts it down and deletes its files."""

    bindir: Path
    root: Path
    port: int
    run_as: pwd.struct_passwd | None
    host: str = "127.0.0.1"
    options: str = ""
    """The server's command-line options (`pg_ctl start -o`), for starting it again after `halt`."""
    _stopped: bool = field(default=False, repr=False)

    @property
    def data_dir(self) -> Path:
        """The cluster's data folder."""
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        """The server log (read it when a test fails on the server side)."""
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of `database` on this server (psycopg 3)."""
        return f"postgresql+psycopg://{SUPERUSER}@{self.host}:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit psycopg connection to `database` as the superuser (close it, or use it in `with`)."""
        return psycopg.connect(
            host=self.host, port=self.port, user=SUPERUSER, dbname=database, autocommit=True
        )

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Create database `name` (a copy of `template` when given) and return its URL."""
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
        with self.connect() as connection:
            connection.execute(statement)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database `name`, disconnecting anyone still on it."""
        with self.connect() as connection:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    @contextmanager
    def scratch_database(self, prefix: str, *, template: str | None = None) -> Iterator[str]:
        """A new database `PREFIX_<random hex>` (a copy of `template` when given) for a `with` block: its
        URL. It is dropped afterwards."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        url = self.create_database(name, template=template)
        try:
            yield url
        finally:
            self.drop_database(name)

    def halt(self) -> None:
        """Shut the server down (fast: sessions are cut) and keep its files, as a restart or a crash of
        the database server does to its clients; `resume` starts it again."""
        _run(
            [self.bindir / "pg_ctl", "stop", "-D", self.data_dir, "-m", "fast", "-w", "-t", "60"],
            run_as=self.run_as,
        )

    def resume(self) -> None:
        """Start the server `halt` stopped, on the same port."""
        _run(
            [
                self.bindir / "pg_ctl",
                "start",
                "-D",
                self.data_dir,
                "-l",
                self.log_file,
                "-w",
                "-t",
                "60",
                "-o",
                self.options,
            ],
            run_as=self.run_as,
        )

    def stop(self) -> None:
        """Shut the server down and delete its folder. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        try:
            _run(
                [self.bindir / "pg_ctl", "stop", "-D", self.data_dir, "-m", "fast", "-w", "-t", "60"],
                run_as=self.run_as,
            )
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def find_bindir() -> Path:
    """The folder holding `initdb` and `pg_ctl`: `pg_config --bindir`, else the newest Debian install."""
    pg_config = shutil.which("pg_config")
    candidates: list[Path] = []
    if pg_config:
        output = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(output.stdout.strip()))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for candidate in candidates:
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    raise PosbiasError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install them (e.g. apt-get install "
        "postgresql-15) and make sure `pg_config --bindir` points at them"
    )


def _server_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise PosbiasError(
            "PostgreSQL will not run as root and there is no `postgres` user to run it as: create one "
            "(useradd --system --no-create-home postgres) or run as a normal user"
        ) from None


def _check_reachable(folder: Path, user: pwd.struct_passwd) -> None:
    """The server user must be able to enter every folder above its data folder."""
    for part in (folder, *folder.parents):
        mode = part.stat()
        if not mode.st_mode & 0o001 and mode.st_uid != user.pw_uid:
            raise PosbiasError(
                f"the {user.pw_name} user cannot enter {part}, so PostgreSQL cannot use a folder under it: "
                "point TMPDIR at a folder it can reach (e.g. TMPDIR=/tmp)"
            )


def _run(command: list[str | Path], *, run_as: pwd.struct_passwd | None) -> None:
    ids: dict[str, Any] = (
        {} if run_as is None else {"user": run_as.pw_uid, "group": run_as.pw_gid, "extra_groups": []}
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, env=env, check=False, **ids
    )
    if done.returncode != 0:
        name = Path(str(command[0])).name
        raise PosbiasError(f"{name} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()}")


def start(*, settings: Mapping[str, str] = FAST_SETTINGS, bindir: Path | None = None) -> PostgresServer:
    """Initialise and start a server in a new temporary folder. Stop it with `PostgresServer.stop()`; it
    is also stopped when the process exits."""
    bindir = bindir or find_bindir()
    run_as = _server_user()
    root = Path(tempfile.mkdtemp(prefix="posbias-pg-"))
    try:
        if run_as is not None:
            _check_reachable(root.parent, run_as)
            os.chown(root, run_as.pw_uid, run_as.pw_gid)
        data = root / "data"
        _run(
            [
                bindir / "initdb",
                "-D",
                data,
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            run_as=run_as,
        )
        options = [f"-c {key}={value}" for key, value in settings.items()]
        for attempt in range(START_ATTEMPTS):
            port = free_port()
            server_options = [
                f"-p {port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={root}",
                *options,
            ]
            try:
                _run(
                    [
                        bindir / "pg_ctl",
                        "start",
                        "-D",
                        data,
                        "-l",
                        root / "server.log",
                        "-w",
                        "-t",
                        "60",
                        "-o",
                        " ".join(server_options),
                    ],
                    run_as=run_as,
                )
            except PosbiasError:
                if attempt == START_ATTEMPTS - 1:
                    log = (root / "server.log").read_text(errors="replace")[-2000:]
                    raise PosbiasError(f"PostgreSQL did not start: {log.strip()}") from None
                continue
            server = PostgresServer(
                bindir=bindir, root=root, port=port, run_as=run_as, options=" ".join(server_options)
            )
            atexit.register(server.stop)
            return server
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    raise AssertionError("unreachable")


@contextmanager
def running(*, settings: Mapping[str, str] = FAST_SETTINGS) -> Iterator[PostgresServer]:
    """A throwaway server for the duration of a `with` block."""
    server = start(settings=settings)
    try:
        yield server
    finally:
        server.stop()
