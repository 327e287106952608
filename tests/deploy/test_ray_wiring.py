"""How the deployments connect the dispatcher to Ray, on a real `ray start --head` cluster with token
authentication and a real PostgreSQL (the fake engine stands in for vLLM):

- compose.yaml: a dispatcher outside the Ray head, through Ray Client (`ray://HEAD:PORT`), with the token;
- rayjob.yaml and `ray up`: a dispatcher on a Ray node, `--ray-address auto`;
- a client without the token is refused.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.postgres

BIN = Path(sys.executable).parent
QUESTIONS = 12


@dataclass(frozen=True)
class Cluster:
    gcs: str
    client: str
    token: str
    database_url: str
    workdir: Path

    def env(self, *, token: bool = True, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("POSBIAS_", "RAY_"))}
        env |= {"POSBIAS_DATABASE_URL": self.database_url, "HOME": str(self.workdir), **extra}
        if token:
            env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}
        return env

    def posbias(
        self, *args: str, env: dict[str, str], timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "posbias"), *args],
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    from support import postgres as throwaway_postgres

    workdir = Path(tempfile.mkdtemp(prefix="posbias-ray-"))  # short: Ray's socket paths have a length limit
    token = secrets.token_hex(32)
    gcs_port, client_port = _free_port(), _free_port()
    log = (workdir / "ray.log").open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "HOME": str(workdir)}
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"  # a test cluster has nothing to drain at the end
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={gcs_port}",
            f"--ray-client-server-port={client_port}",
            "--num-cpus=2",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={workdir / 'ray'}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so that stopping it stops only its processes
    )
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in (workdir / "ray.log").read_text():
            assert head.poll() is None, (workdir / "ray.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "ray start --head did not come up in 90 s"
            time.sleep(0.5)
        with throwaway_postgres.running() as server:
            ready = Cluster(
                gcs=f"127.0.0.1:{gcs_port}",
                client=f"ray://127.0.0.1:{client_port}",
                token=token,
                database_url=server.url("postgres"),
                workdir=workdir,
            )
            migrated = ready.posbias("db", "upgrade", env=ready.env())  # the migrate Job / service
            assert migrated.returncode == 0, migrated.stderr
            yield ready
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _submit(cluster: Cluster, key: str) -> str:
    questions = cluster.workdir / "questions.jsonl"
    if not questions.exists():
        questions.write_text(
            "".join(
                f'{{"subject": "s", "question": "q{i}?", "choices": ["a{i}", "b{i}", "c{i}", "d{i}"], '
                f'"answer": {i % 4}}}\n'
                for i in range(QUESTIONS)
            )
        )
    spec = cluster.workdir / f"{key}.yaml"
    spec.write_text(
        f"model: {key}\nengine: {{name: fake}}\ndataset: {{name: tiny, path: {questions}}}\n"
        "batch_sizes: [1, 4]\niterations: 2\n"
    )
    done = cluster.posbias("submit", str(spec), "--idempotency-key", key, "--json", env=cluster.env())
    assert done.returncode == 0, done.stderr
    return key


def _job_status(cluster: Cluster, model: str) -> str:
    import psycopg

    url = cluster.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT status FROM jobs WHERE spec->>'model' = %s", (model,)).fetchone()
    assert row is not None
    return str(row[0])


def test_dispatcher_outside_the_head_through_ray_client_with_the_token(cluster: Cluster) -> None:
    """compose.yaml's worker service: `posbias worker --ray-address ray://ray-head:10001`."""
    model = _submit(cluster, "via-client")
    done = cluster.posbias("worker", "--ray-address", cluster.client, "--until-empty", env=cluster.env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert _job_status(cluster, model) == "done"


def test_dispatcher_on_a_ray_node_with_auto(cluster: Cluster) -> None:
    """rayjob.yaml and `ray up`: the dispatcher runs on a node of the cluster, `--ray-address auto`."""
    model = _submit(cluster, "via-auto")
    env = cluster.env(RAY_ADDRESS=cluster.gcs)  # what a Ray job's driver, or a node's shell, has
    done = cluster.posbias("worker", "--ray-address", "auto", "--until-empty", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _job_status(cluster, model) == "done"


def test_a_dispatcher_without_the_token_is_refused(cluster: Cluster) -> None:
    """Ray Client gives up after its own timeouts (5, 10 and 15 s by default, 30 s in all); Ray's variables
    set them to 1, 2 and 2 s here, as a user could, so the refusal takes 5 s rather than 30."""
    model = _submit(cluster, "no-token")
    env = cluster.env(
        token=False, RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S="1", RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S="2"
    )
    done = cluster.posbias("worker", "--ray-address", cluster.client, "--until-empty", env=env, timeout=300)
    assert done.returncode != 0
    assert "cannot reach the Ray cluster" in done.stdout + done.stderr
    assert _job_status(cluster, model) == "queued"
