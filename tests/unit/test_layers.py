"""The package's shape, checked from its source: one import package, imports that point down the layers
(schemas <- workers <- service <- posbias API <- CLI), and one module that moves shards between statuses."""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Collection, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "posbias"
FOLDERS = ("schemas", "service", "workers", "migrations")


def _modules(folder: str) -> list[Path]:
    """The modules of a top-level folder (`schemas`, `service`, ...) or of `cli` (in posbias/)."""
    return sorted((REPO / folder if folder in FOLDERS else PACKAGE / folder).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, by absolute name (inside functions too: a lazy import is an import)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _offending(paths: list[Path], *, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(REPO)} imports {name}"
        for path in paths
        for name in sorted(_imports(path))
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


def test_the_build_maps_the_folders_onto_subpackages_without_links() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {f"posbias.{name}": name for name in FOLDERS}
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=True)
    # Every folder that holds a tracked file is listed, code or data (the report's assets), so the wheel
    # holds all of it and setuptools sees no package it would leave out (it warns of each at every install).
    folders = {Path(line.split("\t")[-1]).parent for line in tracked.stdout.splitlines()}
    found = {
        ".".join(folder.parts if folder.parts[0] == "posbias" else ("posbias", *folder.parts))
        for folder in folders
        if folder.parts and folder.parts[0] in {*FOLDERS, "posbias"}
    }
    assert set(config["packages"]) == found
    links = [line.split("\t")[-1] for line in tracked.stdout.splitlines() if line.startswith("120000")]
    assert links == [], f"symbolic links are tracked: {links}"


def test_schemas_import_neither_workers_nor_service() -> None:
    assert (
        _offending(_modules("schemas"), forbidden=("posbias.workers", "posbias.service", "posbias.api")) == []
    )


def test_workers_import_neither_the_service_nor_sqlalchemy() -> None:
    forbidden = ("posbias.service", "posbias.api", "sqlalchemy", "alembic")
    assert _offending(_modules("workers"), forbidden=forbidden) == []


def test_nothing_imports_the_folders_as_top_level_packages() -> None:
    every = [
        *PACKAGE.glob("*.py"),
        *(p for f in ("schemas", "service", "workers", "migrations") for p in _modules(f)),
    ]
    top = ("schemas", "service", "workers", "migrations")
    assert _offending(every, forbidden=top) == []


def _assigns_shard_status(tree: ast.AST) -> list[int]:
    """Lines that set a shard's status: `x.status = ShardStatus.y`, `status=ShardStatus.y` (e.g. in
    `.values(...)`), or `"status": ShardStatus.y` (a row to insert)."""

    def is_shard_status(value: ast.AST | None) -> bool:
        return (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id == "ShardStatus"
        )

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and is_shard_status(node.value):
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in node.targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "status" and is_shard_status(node.value):
            lines.append(node.value.lineno)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "status" and is_shard_status(value):
                    lines.append(value.lineno)
    return lines


def test_only_the_queue_assigns_a_shard_status() -> None:
    every = [*PACKAGE.glob("*.py"), *(p for f in ("schemas", "service", "workers") for p in _modules(f))]
    found = {
        str(path.relative_to(REPO)): lines
        for path in every
        if (lines := _assigns_shard_status(ast.parse(path.read_text())))
    }
    assert set(found) == {"service/work/queue.py"}, found


def test_the_check_sees_a_status_assignment() -> None:
    # The check above must be able to fail: each form it looks for, in a snippet.
    snippet = (
        "shard.status = ShardStatus.done\n"
        "update(Shard).values(status=ShardStatus.dead)\n"
        'row = {"status": ShardStatus.queued}\n'
    )
    assert sorted(_assigns_shard_status(ast.parse(snippet))) == [1, 2, 3]
    assert _assigns_shard_status(ast.parse("if shard.status is ShardStatus.done: pass")) == []


def test_the_built_wheel_holds_one_import_package(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    assert built.stderr == "", built.stderr[-2000:]  # no setuptools warning, as on every `pip install -e .`
    (wheel,) = tmp_path.glob("posbias-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {name for name in top if not name.endswith(".dist-info")} == {"posbias"}
    shipped = ("posbias/api.py", "posbias/service/work/queue.py", "posbias/migrations/alembic.ini")
    for module in (*shipped, "posbias/service/reports/report_assets/report.js"):
        assert module in names, f"{module} is missing from the wheel"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "posbias = posbias.cli.app:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_editable_build_of_setup_sh_prints_no_warning(tmp_path: Path) -> None:
    """scripts/setup.sh's editable install (`pip install -e`, which shows a build backend's warnings even with
    --quiet): built here by the backend's own hook, under the variables setup.sh gives it."""
    script = (REPO / "scripts" / "setup.sh").read_text().splitlines()
    (line,) = [x for x in script if "pip install" in x and " -e " in x]
    words = shlex.split(line.split(" python ", 1)[0]) if " python " in line else []
    settings = dict(word.split("=", 1) for word in words if "=" in word)
    hook = "import sys; from setuptools import build_meta; build_meta.build_editable(sys.argv[1])"
    built = subprocess.run(
        [sys.executable, "-c", hook, str(tmp_path)],
        cwd=REPO,
        env={**os.environ, **settings},
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    warned = [x for x in built.stderr.splitlines() if "Warning" in x or "InformationOnly" in x]
    assert warned == [], built.stderr[-3000:]


def test_the_editable_install_exposes_only_posbias(tmp_path: Path) -> None:
    # From a folder outside the checkout, as a user's notebook runs: the API is there, and the folders are
    # not importable on their own.
    probe = (
        "import importlib.util, posbias\n"
        "missing = [n for n in posbias.__all__ if not hasattr(posbias, n)]\n"
        "assert not missing, missing\n"
        "top = ('schemas', 'service', 'workers', 'migrations')\n"
        "loose = [n for n in top if importlib.util.find_spec(n)]\n"
        "assert not loose, loose\n"
        "import posbias.workers.actor as actor\n"
        "assert actor.ShardActor.__module__ == 'posbias.workers.actor'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_test_modules_have_unique_names() -> None:
    # pytest imports test files by basename (the test folders are not packages): a second test_x.py in
    # another folder stops the whole suite at collection.
    names = [path.name for path in (REPO / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def _module_name(path: Path) -> str:
    """`service/work/queue.py` -> `posbias.service.work.queue`; `posbias/cli/app.py` -> `posbias.cli.app`."""
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[0] != "posbias":
        parts = ("posbias", *parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _product_modules() -> dict[str, Path]:
    paths = [*PACKAGE.rglob("*.py"), *(p for f in FOLDERS for p in _modules(f))]
    return {_module_name(path): path for path in paths}


def _top_level_imports(path: Path, known: Collection[str]) -> set[str]:
    """The posbias modules `path` imports when it is imported: statements at module level, outside `if
    TYPE_CHECKING:` (annotations only); `from a import b` counts `a.b` when that is a module, else `a`."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for block in ("body", "orelse", "finalbody", "handlers"):
                    for part in getattr(node, block, []):
                        visit(part.body if isinstance(part, ast.ExceptHandler) else [part])
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in known)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    found.add(name if name in known else node.module)

    visit(ast.parse(path.read_text()).body)
    return {name for name in found if name in known}


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _import_graph() -> dict[str, set[str]]:
    modules = _product_modules()
    # A package's own __init__ is imported before any of its modules: an edge to it is no cycle by itself.
    return {
        name: {other for other in _top_level_imports(path, modules) if other != name}
        for name, path in modules.items()
    }


def test_no_import_cycles_among_posbias_modules() -> None:
    assert _cycles(_import_graph()) == []


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from posbias.service.work import queue\nif TYPE_CHECKING:\n    from posbias.service.work import "
        "jobs\n"
        "def later():\n    from posbias.service.work import jobs\n"
    )
    known = {"posbias.service.work", "posbias.service.work.queue", "posbias.service.work.jobs"}
    assert _top_level_imports(probe, known) == {"posbias.service.work.queue"}


def test_the_store_only_moves_rows() -> None:
    # The queue decides (a shard's status, the job's that follows it) and hands the store the rows it locked.
    # Lazy imports count here: the store must not reach up even inside a function.
    store = sorted((REPO / "service" / "store").rglob("*.py"))
    assert store, "no store module found"
    assert _offending(store, forbidden=("posbias.service.work", "posbias.service.dispatch")) == []


def test_the_cli_stands_on_the_api_alone() -> None:
    # Everything a command does is one call of the public API; the CLI renders what it returns. Besides the
    # API, it tells `posbias.startup` when a command starts (the collector's pace; the API ends the start).
    allowed = ("posbias", "posbias.api", "posbias.schemas", "posbias.cli", "posbias.startup")
    offending = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _modules("cli")
        for name in sorted(_imports(path))
        if name.startswith("posbias.") and not any(name == a or name.startswith(a + ".") for a in allowed[1:])
    ]
    assert offending == []
    below = [*PACKAGE.glob("*.py"), *(p for f in FOLDERS for p in _modules(f))]
    assert _offending(below, forbidden=("posbias.cli",)) == []


def test_importing_posbias_imports_no_command() -> None:
    probe = "import sys, posbias\nprint(sorted(m for m in sys.modules if m.startswith('posbias.')))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "posbias.cli" not in done.stdout, done.stdout


# A module over 500 lines or a class over 300 is one that holds several nouns, unless it is listed here with
# the reason one noun needs more.
LONG_MODULES: dict[str, str] = {
    "posbias.service.schedules.verdicts": "one decision (the CI gate's checks, the baseline's choice); it "
    "passed 500 lines when its imports from stats became one statement through the face (issue 38)",
}
LONG_CLASSES: dict[str, str] = {}


def test_modules_and_classes_stay_readable() -> None:
    long_modules, long_classes = [], []
    for name, path in sorted(_product_modules().items()):
        if name.startswith("posbias.migrations.versions"):
            continue  # history is not refactored
        text = path.read_text()
        if text.count("\n") > 500 and name not in LONG_MODULES:
            long_modules.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > 300 and f"{name}.{node.name}" not in LONG_CLASSES:
                    long_classes.append(f"{name}.{node.name}: {size} lines")
    assert long_modules == [] and long_classes == []


# The service's packages, and the packages each may import (DESIGN.md, "Layout"); what one of them imports
# from another it imports through that one's face, `__init__.py`.
SERVICE_ORDER: dict[str, tuple[str, ...]] = {
    "store": (),
    "stats": ("store",),
    "work": ("store", "stats"),
    "dispatch": ("store", "stats", "work"),
    "schedules": ("store", "stats", "work"),
    "reports": ("store", "stats", "work", "schedules"),
    "diagnose": ("store", "stats", "work", "schedules", "reports"),
}
SERVICE_ROOT = ("__init__", "settings")
"""The modules left directly in service/: everything else lives in a package."""


def _service_package(name: str) -> str | None:
    """`posbias.service.work.jobs` -> `work`; None for a name outside the service's packages."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["posbias", "service"] else None


def test_the_service_is_in_packages() -> None:
    loose = sorted(path.stem for path in (REPO / "service").glob("*.py"))
    assert loose == sorted(SERVICE_ROOT)
    packages = {path.parent.name for path in (REPO / "service").glob("*/__init__.py")}
    assert packages == set(SERVICE_ORDER)


def _order_offences(paths: list[Path], *, root: Path = REPO) -> list[str]:
    found = []
    for path in paths:
        mine = path.relative_to(root).parts[1]
        for other in sorted({_service_package(name) for name in _imports(path)} - {None}):
            if other in SERVICE_ORDER and other != mine and other not in SERVICE_ORDER[mine]:
                found.append(f"{path.relative_to(root)} imports posbias.service.{other}")
    return found


def test_the_service_packages_import_down_their_order() -> None:
    # Lazy imports count: a package that reaches up even inside a function is one the order does not hold.
    paths = [path for path in _modules("service") if len(path.relative_to(REPO).parts) == 3]
    assert _order_offences(paths) == []
    root = [REPO / "service" / f"{name}.py" for name in SERVICE_ROOT]
    assert [f"{p.name} imports {n}" for p in root for n in _imports(p) if _service_package(n)] == []


def _face_exports(package: str) -> set[str]:
    face = REPO / "service" / package / "__init__.py"
    exported: set[str] = set()
    for node in ast.parse(face.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id in ("_HOMES", "_MODULES") and node.value is not None:
            exported.update(ast.literal_eval(node.value))
    return exported


def _face_offences(paths: list[Path], *, root: Path = REPO) -> list[str]:
    """Imports of a service package, from outside it, that pass by its face: a module path below the package,
    or a name the face does not export."""
    found = []
    for path in paths:
        parts = path.relative_to(root).parts
        mine = parts[1] if parts[0] == "service" and len(parts) == 3 else None
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in names:
                package = _service_package(module)
                if package not in SERVICE_ORDER or package == mine:
                    continue
                if module.count(".") > 2 or name is None:
                    found.append(f"{path.relative_to(root)}:{node.lineno} imports {module} past its face")
                elif name not in _face_exports(package):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {package}'s face has no {name}")
    return found


def test_the_api_and_the_packages_import_a_package_through_its_face() -> None:
    paths = [*PACKAGE.rglob("*.py"), *(p for p in _modules("service") if len(p.relative_to(REPO).parts) == 3)]
    assert _face_offences(paths) == []


def test_the_order_and_face_checks_see_an_offence(tmp_path: Path) -> None:
    # Both checks must be able to fail: a store module that reaches up past a face, an API module that asks a
    # face for a name it does not export.
    (tmp_path / "service" / "store").mkdir(parents=True)
    (tmp_path / "posbias").mkdir()
    store = tmp_path / "service" / "store" / "probe.py"
    store.write_text("def later():\n    from posbias.service.work.jobs import get\n")
    api = tmp_path / "posbias" / "probe.py"
    api.write_text("from posbias.service.store import no_such_name\n")
    assert _order_offences([store], root=tmp_path) == ["service/store/probe.py imports posbias.service.work"]
    assert _face_offences([store, api], root=tmp_path) == [
        "service/store/probe.py:2 imports posbias.service.work.jobs past its face",
        "posbias/probe.py:1: store's face has no no_such_name",
    ]


def test_one_name_one_module() -> None:
    # A reader finds where a thing lives from its name alone: no two library modules (nor a module and a
    # package) share a name. The CLI's command files are named after their commands and stand apart.
    paths = [
        path
        for folder in (PACKAGE, *(REPO / f for f in FOLDERS))
        for path in folder.rglob("*.py")
        if "cli" not in path.relative_to(REPO).parts[:2] and "versions" not in path.parts
    ]
    names = [path.stem for path in paths if path.stem != "__init__"]
    names += [path.parent.name for path in paths if path.stem == "__init__" and path.parent != PACKAGE]
    assert sorted({name for name in names if names.count(name) > 1}) == []
