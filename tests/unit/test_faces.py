"""The faces: `posbias/__init__.py`, `schemas/__init__.py` and each service package's `__init__.py` name
every export once (`_HOMES`), load it on first use, and have a typed view (`__init__.pyi`) written from that
one mapping."""

from __future__ import annotations

import importlib
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
faces = runpy.run_path(str(REPO / "scripts" / "faces.py"), run_name="faces")


def _module(face: Path) -> str:
    parts = face.relative_to(REPO).parent.parts
    return ".".join(parts if parts[0] == "posbias" else ("posbias", *parts))


FACES = faces["faces"]()


def test_every_service_package_has_a_face() -> None:
    packages = {path.parent for path in (REPO / "service").glob("*/*.py")}
    assert {face.parent for face in FACES if face.parent.parent.name == "service"} == packages


@pytest.mark.parametrize("face", FACES, ids=lambda face: _module(face))
def test_the_typed_view_is_written_from_the_mapping(face: Path) -> None:
    stub = face.with_suffix(".pyi")
    assert stub.exists() and stub.read_text() == faces["stub"](face), "run: python scripts/faces.py"


@pytest.mark.parametrize("face", FACES, ids=lambda face: _module(face))
def test_every_exported_name_loads_from_its_home(face: Path) -> None:
    homes, modules = faces["exports"](face)
    package = importlib.import_module(_module(face))
    assert package.__all__ == sorted([*homes, *modules])
    for name, home in homes.items():
        assert getattr(package, name) is getattr(importlib.import_module(home), name), name
    for name in modules:
        assert getattr(package, name) is importlib.import_module(f"{package.__name__}.{name}")


def test_a_face_imports_nothing_until_asked() -> None:
    probe = (
        "import sys, posbias, posbias.service.reports, posbias.service.store\n"
        "print(sorted(m for m in sys.modules if m.startswith('posbias.service.') and m.count('.') > 2))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
