"""Every file posbias reads is refused in one line when it is not a regular file: a FIFO in its place hung
`submit` or a schedule's tick forever (opening one waits for a writer that never comes). Each test here would
hang without that check; the timeout turns such a regression into a failure."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

from posbias.schemas import DatasetSpec, JobSpec, PosbiasError
from posbias.schemas.files import read_bytes, read_text
from posbias.service.schedules.checkpoints import incomplete_reason, scan_folder
from posbias.service.work import submission
from posbias.service.work.datasets import load_questions
from posbias.workers.models import check_model_source

pytestmark = pytest.mark.timeout(20)

NOT_REGULAR = "is not a regular file (a pipe, socket or device)"


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _refused(call: object, *, match: str = NOT_REGULAR) -> str:
    assert callable(call)
    with pytest.raises(PosbiasError, match=match.replace("(", r"\(").replace(")", r"\)")) as refused:
        call()
    said = str(refused.value)
    assert "\n" not in said
    return said


def test_the_reader_refuses_a_fifo_a_socket_a_device_and_a_folder(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "pipe.txt")
    said = _refused(lambda: read_bytes(fifo, what="data file", fix="give a text file", limit=100))
    assert said == f"data file {fifo} {NOT_REGULAR}; give a text file"
    _refused(lambda: read_text(Path("/dev/zero"), what="data file", fix="give a text file", limit=100))
    _refused(
        lambda: read_text(tmp_path, what="data file", fix="give a text file", limit=100), match="is a folder"
    )
    with _socket() as bound:
        _refused(lambda: read_text(bound, what="data file", fix="give a text file", limit=100))


def test_the_reader_bounds_the_size(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("x" * 101)
    said = _refused(lambda: read_text(big, what="data file", fix="fix", limit=100), match="is 101 bytes")
    assert said.endswith("data file is at most 100 bytes")
    assert read_text(big, what="data file", fix="fix", limit=101) == "x" * 101


def test_a_fifo_spec_file(tmp_path: Path) -> None:
    _refused(lambda: JobSpec.from_file(_fifo(tmp_path / "job.yaml")))


def test_a_fifo_filler_source(tmp_path: Path) -> None:
    source = _fifo(tmp_path / "filler.txt")
    spec = JobSpec.build({"model": "m", "filler": {"tokens": [0, 30], "source": str(source)}})
    said = _refused(lambda: submission.read_filler(spec))
    assert said.startswith(f"the filler file {source} ") and said.endswith("or filler source builtin")


def test_a_fifo_mmlu_subject_file(tmp_path: Path) -> None:
    split = tmp_path / "csv" / "test"
    split.mkdir(parents=True)
    (split / "anatomy_test.csv").write_text("What is it?,a,b,c,d,A\n")
    fifo = _fifo(split / "virology_test.csv")
    said = _refused(lambda: load_questions(DatasetSpec(), mmlu_dir=tmp_path))
    assert said.startswith(f"MMLU file {fifo} ")


def test_a_fifo_mmlu_jsonl_is_refused_not_passed_over(tmp_path: Path) -> None:
    _fifo(tmp_path / "mmlu_test.jsonl")
    _refused(lambda: load_questions(DatasetSpec(), mmlu_dir=tmp_path))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".json", ".parquet"])
def test_a_fifo_dataset_path(suffix: str, tmp_path: Path) -> None:
    path = _fifo(tmp_path / f"questions{suffix}")
    said = _refused(lambda: load_questions(DatasetSpec(name="mine", path=str(path)), mmlu_dir=None))
    assert str(path) in said


def test_a_fifo_in_a_checkpoint_or_model_folder(tmp_path: Path) -> None:
    checkpoint = tmp_path / "runs" / "checkpoint-100"
    checkpoint.mkdir(parents=True)
    _fifo(checkpoint / "config.json")
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    reason = incomplete_reason(checkpoint)
    assert reason is not None and NOT_REGULAR in reason
    found = scan_folder(tmp_path / "runs")
    assert found.found == [] and [w.name for w in found.waiting] == ["checkpoint-100"]
    said = _refused(lambda: check_model_source(str(checkpoint)))
    assert said.startswith(f"model folder {checkpoint} holds config.json, which {NOT_REGULAR}")


class _socket:
    """A listening Unix socket in a short folder (a socket's path is at most 107 bytes)."""

    def __enter__(self) -> Path:
        self._dir = tempfile.TemporaryDirectory(prefix="pb-")
        path = Path(self._dir.name) / "s.csv"
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.bind(str(path))
        return path

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
        self._dir.cleanup()


def test_a_socket_dataset_path() -> None:
    with _socket() as path:
        _refused(lambda: load_questions(DatasetSpec(name="mine", path=str(path)), mmlu_dir=None))
