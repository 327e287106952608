"""Writes the typed view (`__init__.pyi`) of every package whose `__init__.py` is a lazy face.

A face (`posbias/__init__.py`, `schemas/__init__.py`, `service/<package>/__init__.py`) names each name it
exports once, in its `_HOMES` mapping (name -> module), and its namespace modules in `_MODULES`; it loads them
on first use, which mypy and editors cannot follow. The stub written here says the same thing statically. Run
it after changing a face; tests/unit/test_faces.py fails while a stub differs from what this writes.

    python scripts/faces.py          # write the stubs
    python scripts/faces.py --check  # only say which differ
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def faces() -> list[Path]:
    """Every `__init__.py` with a `_HOMES` mapping."""
    found = [
        REPO / "posbias" / "__init__.py",
        REPO / "schemas" / "__init__.py",
        *sorted((REPO / "service").glob("*/__init__.py")),
    ]
    return [path for path in found if "_HOMES" in path.read_text()]


def exports(face: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    """A face's `_HOMES` and `_MODULES`, read from its source (literals)."""
    homes: dict[str, str] = {}
    modules: tuple[str, ...] = ()
    for node in ast.parse(face.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and node.value is not None:  # type: ignore[union-attr]
            if target.id == "_HOMES":
                homes = ast.literal_eval(node.value)  # type: ignore[union-attr]
            elif target.id == "_MODULES":
                modules = tuple(ast.literal_eval(node.value))  # type: ignore[union-attr]
    return homes, modules


def stub(face: Path) -> str:
    """The `__init__.pyi` of a face, formatted as ruff formats it."""
    homes, modules = exports(face)
    by_module: dict[str, list[str]] = {}
    for name, module in homes.items():
        by_module.setdefault(module, []).append(name)
    lines = [
        f'"""Typed view of `{face.relative_to(REPO).parent}/__init__.py`, written by scripts/faces.py: '
        'do not edit."""',
        "",
    ]
    lines += [
        f"from {module} import {', '.join(f'{n} as {n}' for n in sorted(names))}"
        for module, names in sorted(by_module.items())
    ]
    lines += [f"from . import {m} as {m}" for m in sorted(modules)]
    lines += ["", f"__all__ = {sorted([*homes, *modules])!r}", ""]
    text = "\n".join(lines)
    name = str(face.with_suffix(".pyi"))
    ruff = [sys.executable, "-m", "ruff"]
    text = _ruff([*ruff, "check", "--fix-only", "--select", "I,RUF022", "--stdin-filename", name, "-"], text)
    return _ruff([*ruff, "format", "--stdin-filename", name, "-"], text)


def _ruff(command: list[str], text: str) -> str:
    done = subprocess.run(command, input=text, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode not in (0, 1) or not done.stdout:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr}")
    return done.stdout


def main() -> int:
    stale = []
    for face in faces():
        text, path = stub(face), face.with_suffix(".pyi")
        if not path.exists() or path.read_text() != text:
            stale.append(str(path.relative_to(REPO)))
            if "--check" not in sys.argv:
                path.write_text(text)
    print("\n".join(stale) if stale else "every stub is current")
    return 1 if stale and "--check" in sys.argv else 0


if __name__ == "__main__":
    sys.exit(main())
