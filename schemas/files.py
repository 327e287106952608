"""Reading a file posbias was pointed at: a spec, a dataset, a filler source, a model's config.

Every read goes through here so that each refuses the same things the same way: what is not a regular file
(a FIFO would block until a writer comes, a device never ends, a socket cannot be opened, a folder is not
data), and a file over its size bound. Every problem is a `PosbiasError`, one line naming the file and the
fix.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from posbias.schemas.errors import PosbiasError, one_line

MAX_DATA_FILE_BYTES = 4 << 30
"""A dataset file (CSV, JSON, JSONL, Parquet) posbias reads questions from."""
MAX_CONFIG_BYTES = 64 << 20
"""A model's `config.json` or a weights index beside it."""
NOT_REGULAR = "is not a regular file (a pipe, socket or device)"


@contextmanager
def open_binary(path: str | Path, *, what: str, fix: str, limit: int, noun: str = "") -> Iterator[BinaryIO]:
    """`path` opened for reading in binary, once it is checked to be a regular file of at most `limit` bytes.

    `what` names the file in messages (`dataset file`), `fix` says what to give instead, `noun` how the size
    bound reads (`a spec`; default: `what`). The checks are on the open file, so what is read is what was
    checked.
    """
    file = Path(path)
    check_path(file, what=what)
    try:
        # Non-blocking, so that opening a FIFO returns at once instead of waiting for a writer.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except IsADirectoryError:
        raise PosbiasError(f"{what} {file} is a folder; {fix}") from None
    except OSError as exc:
        if _special(file):  # a socket cannot be opened at all
            raise PosbiasError(f"{what} {file} {NOT_REGULAR}; {fix}") from None
        raise PosbiasError(f"cannot read {what} {file}: {exc.strerror or one_line(exc)}; {fix}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise PosbiasError(f"{what} {file} is a folder; {fix}")
        if not stat.S_ISREG(info.st_mode):
            raise PosbiasError(f"{what} {file} {NOT_REGULAR}; {fix}")
        if info.st_size > limit:
            raise PosbiasError(
                f"{what} {file} is {info.st_size:,} bytes; {noun or what} is at most {limit:,} bytes"
            )
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


@contextmanager
def open_text(
    path: str | Path, *, what: str, fix: str, limit: int, newline: str | None = None
) -> Iterator[TextIO]:
    """`open_binary`, decoded as UTF-8 (a byte-order mark is skipped); `newline` as for `open`."""
    with open_binary(path, what=what, fix=fix, limit=limit) as raw:
        yield io.TextIOWrapper(raw, encoding="utf-8-sig", newline=newline)


def read_bytes(path: str | Path, *, what: str, fix: str, limit: int, noun: str = "") -> bytes:
    """The whole of a regular file of at most `limit` bytes (see `open_binary`)."""
    try:
        with open_binary(path, what=what, fix=fix, limit=limit, noun=noun) as handle:
            data = handle.read(limit + 1)  # a regular file may grow while it is read
    except OSError as exc:
        raise PosbiasError(f"cannot read {what} {path}: {exc.strerror or one_line(exc)}; {fix}") from None
    if len(data) > limit:
        raise PosbiasError(
            f"{what} {path} is over {limit:,} bytes; {noun or what} is at most {limit:,} bytes"
        )
    return data


def read_text(path: str | Path, *, what: str, fix: str, limit: int, noun: str = "") -> str:
    """`read_bytes` decoded as UTF-8 (a byte-order mark is skipped)."""
    raw = read_bytes(path, what=what, fix=fix, limit=limit, noun=noun)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PosbiasError(
            f"{what} {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it "
            "as UTF-8"
        ) from None


def check_path(path: str | Path, *, what: str) -> None:
    """Refuse a path with a control character (a CR or LF pasted with it): such a name is almost never meant,
    and would be stored and shown as something else."""
    text = str(path)
    if any(ord(char) < 0x20 or char == "\x7f" for char in text):
        raise PosbiasError(
            f"the path of the {what} {text[:200]!r} holds a control character (CR, LF, tab); give it on one "
            "line without them"
        )


def check_folder_files(folder: str | Path, *, what: str) -> None:
    """Refuse a folder holding anything a reader would block on or never finish: a FIFO, socket or device
    (libraries such as transformers open a model folder's files themselves)."""
    root = Path(folder)
    check_path(root, what=what)
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        raise PosbiasError(f"cannot list {what} {root}: {exc.strerror or one_line(exc)}") from None
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            mode = os.stat(entry.path).st_mode  # through a link: what a reader would open
        except OSError:
            continue  # a dangling link is not read; the library says what is missing
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise PosbiasError(
                f"{what} {root} holds {entry.name}, which {NOT_REGULAR}; remove it or replace it with the "
                "file itself"
            )


def _special(file: Path) -> bool:
    try:
        mode = os.stat(file).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))
