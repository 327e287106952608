"""`export` writes where it is told without destroying what is there: a new or replaced regular file appears
complete or not at all (temporary file, renamed), a device or a pipe is written to and stays what it is, a
symbolic link is followed and kept, an existing file is replaced only when asked, and a failure leaves no
`.partial` behind."""

from __future__ import annotations

import csv
import errno
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.job_runs import answer_every_shard

from posbias.schemas import PosbiasError, ShardResult, Submitted
from posbias.service.reports import export
from posbias.service.reports.export import OutputExists, export_results
from posbias.service.store.database import Database


@pytest.fixture
def job(db: Database, make_job: Callable[..., Submitted], answer: Callable[..., ShardResult]) -> int:
    """A finished job: 4 iterations at batch sizes 2 and 3 (20 results)."""
    job_id = make_job(db).job_id
    answer_every_shard(db, job_id, answer)
    return job_id


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A folder for exports alone (the SQLite store lives in tmp_path)."""
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def rows_in(path: Path) -> int:
    with path.open(newline="") as handle:
        return sum(1 for _ in csv.reader(handle)) - 1


def test_a_new_file_appears_complete_and_nothing_else_is_left(db: Database, job: int, out: Path) -> None:
    summary = export_results(db, job, path=out / "results.csv")
    assert summary.rows == rows_in(out / "results.csv") == 20
    assert sorted(p.name for p in out.iterdir()) == ["results.csv"]
    assert stat.S_IMODE((out / "results.csv").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_existing_file_is_replaced_only_when_asked_and_keeps_its_permissions(
    db: Database, job: int, out: Path
) -> None:
    old = out / "results.csv"
    old.write_text("keep me\n")
    old.chmod(0o640)
    with pytest.raises(OutputExists, match="exists: pass --force"):
        export_results(db, job, path=old)
    assert old.read_text() == "keep me\n"

    export_results(db, job, path=old, overwrite=True)
    assert rows_in(old) == 20
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    assert sorted(p.name for p in out.iterdir()) == ["results.csv"]


def test_a_symbolic_link_is_followed_and_stays_a_link(db: Database, job: int, out: Path) -> None:
    real = out / "real.csv"
    real.write_text("old\n")
    link = out / "link.csv"
    link.symlink_to(real)
    export_results(db, job, path=link, overwrite=True)
    assert link.is_symlink() and rows_in(real) == 20

    dangling = out / "later.csv"
    dangling.symlink_to(out / "made.csv")
    export_results(db, job, path=dangling)
    assert dangling.is_symlink() and rows_in(out / "made.csv") == 20


def test_devices_and_pipes_are_written_to_and_never_replaced(db: Database, job: int, out: Path) -> None:
    export_results(db, job, path=Path("/dev/null"), format="csv")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    (out / "null.csv").symlink_to("/dev/null")
    export_results(db, job, path=out / "null.csv", format="parquet")
    assert (out / "null.csv").is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)

    if os.geteuid() == 0:  # a device node of the test's own, where this process may make one
        node = out / "device.csv"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(*divmod(os.stat("/dev/null").st_rdev, 256)))
        export_results(db, job, path=node, format="csv")
        assert stat.S_ISCHR(node.lstat().st_mode), "the device node was replaced by a file"

    fifo = out / "pipe.csv"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    export_results(db, job, path=fifo, format="csv")
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert received and received[0].count(b"\n") == 21  # the header and 20 rows


def test_targets_it_must_not_write_are_refused_and_nothing_is_created(
    db: Database, job: int, out: Path
) -> None:
    (out / "folder.csv").mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(out / "socket.csv"))
    server.close()
    before = sorted(p.name for p in out.iterdir())
    for path, message in [
        (out / "missing" / "results.csv", "folder .* does not exist: create it"),
        (out / "folder.csv", "is a folder"),
        (out / "socket.csv", "socket"),
    ]:
        with pytest.raises(PosbiasError, match=message):
            export_results(db, job, path=path)
    with pytest.raises(PosbiasError, match="no job 999"):
        export_results(db, 999, path=out / "none.csv")
    assert sorted(p.name for p in out.iterdir()) == before


def test_an_export_that_fails_half_way_leaves_no_partial_file(
    db: Database, job: int, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store going away mid-export (the rows are streamed), after some rows were written.
    real = export.result_batches

    def failing(db: Database, job_id: int, **how: Any) -> Iterator[pa.RecordBatch]:
        batches = real(db, job_id, **how)

        def stream() -> Iterator[pa.RecordBatch]:
            try:
                yield next(batches)
                raise OSError(errno.ECONNRESET, "connection to the store lost")
            finally:
                batches.close()  # type: ignore[attr-defined]

        return stream()

    monkeypatch.setattr(export, "result_batches", failing)
    for fmt in ("csv", "parquet"):
        with pytest.raises(OSError, match="connection to the store lost"):
            export_results(db, job, path=out / f"results.{fmt}")
    assert list(out.iterdir()) == []
