"""GPU models on Ray's own autoscaling-cluster simulator, with the real dispatcher (`posbias worker`) and
the fake engine declared as a GPU model (`fake.as_gpu`: its actor reserves `tensor_parallel_size` GPUs, as a
vLLM engine's does), and one transformers (`hf`) job on a tiny model, whose actor holds the GPU device.

The cluster is what `ray.cluster_utils.AutoscalingCluster` starts: a head with Ray's fake multi-node node
provider and the real autoscaler (its monitor), plus one worker node type `gpu` with 1 CPU and 1 GPU,
min 0 and max 1. Its GPU is simulated: Ray accounts for it and sets CUDA_VISIBLE_DEVICES, nothing more. It is
started by a subclass that changes two things: `AutoscalingCluster.start()` runs `ray stop --force`, which
ends every Ray on the machine (this test session's own local Ray among them), so the head runs in a process
group of its own and only that group is stopped; and Ray 2.60's wheel leaves out the example.yaml that the
constructor reads, so its settings are written here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import AutoscalingCluster
from support.job_runs import summary_of
from support.ports import free_port
from support.results import result_rows
from support.tinymodels import tiny_model

from posbias.schemas import Submitted
from posbias.service.store import database, migrate
from posbias.service.store.database import Database
from posbias.service.store.tables import JobStatus, ShardStatus
from posbias.service.work import jobs

BIN = Path(sys.executable).parent
MakeJob = Callable[..., Submitted]

# ray/autoscaler/_private/fake_multi_node/example.yaml (Ray 2.60), which AutoscalingCluster starts from.
FAKE_MULTINODE_BASE: dict[str, Any] = {
    "cluster_name": "fake_multinode",
    "max_workers": 8,
    "provider": {
        "type": "fake_multinode",
        "use_node_id_as_ip": True,
        "disable_node_updaters": True,
        "disable_launch_config_check": True,
    },
    "head_node_type": "ray.head.default",
    "auth": {},
    "upscaling_speed": 1.0,
    "idle_timeout_minutes": 0.1,
    "docker": {},
    "initialization_commands": [],
    "setup_commands": [],
    "head_setup_commands": [],
    "worker_setup_commands": [],
    "head_start_ray_commands": [],
    "worker_start_ray_commands": [],
    "file_mounts": {},
    "cluster_synced_files": [],
    "file_mounts_sync_continuously": False,
    "rsync_exclude": [],
    "rsync_filter": [],
}
GPU_NODE = {"resources": {"CPU": 1, "GPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 1}


class OwnAutoscalingCluster(AutoscalingCluster):  # type: ignore[misc]
    """`AutoscalingCluster`, started in a process group of its own (see the module's docstring)."""

    def __init__(
        self, *, head_resources: dict[str, Any], worker_node_types: dict[str, Any], port: int
    ) -> None:
        self._port = port
        super().__init__(head_resources, worker_node_types)

    def _generate_config(
        self, head_resources: dict[str, Any], worker_node_types: dict[str, Any], **_: Any
    ) -> Any:
        config = json.loads(json.dumps(FAKE_MULTINODE_BASE))
        config["available_node_types"] = {
            **worker_node_types,
            "ray.head.default": {"resources": head_resources, "node_config": {}, "max_workers": 0},
        }
        # The provider starts worker nodes against this GCS (it assumes port 6379 otherwise).
        config["provider"]["gcs_address"] = f"127.0.0.1:{self._port}"
        return config

    def start_in(self, workdir: Path) -> subprocess.Popen[bytes]:
        """`ray start --head --block` with the autoscaling config, as `start()` runs it, in a new session."""
        config = workdir / "autoscaling.json"
        config.write_text(json.dumps(self._config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env |= {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1", "HOME": str(workdir)}
        env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
        self.log = workdir / "ray.log"
        self.log_file = self.log.open("w")
        return subprocess.Popen(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--block",
                f"--autoscaling-config={config}",
                f"--port={self._port}",
                "--node-ip-address=127.0.0.1",
                f"--num-cpus={self._head_resources['CPU']}",
                "--num-gpus=0",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={workdir / 'ray'}",
            ],
            env=env,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@dataclass(frozen=True)
class Cluster:
    gcs: str
    workdir: Path
    db: Database

    def worker(self, *args: str, **env: str) -> subprocess.Popen[str]:
        """`posbias worker --ray-address GCS --json ARGS` against the test's store."""
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("POSBIAS_", "RAY_"))}
        environment |= {
            "POSBIAS_DATABASE_URL": self.db.url,
            "POSBIAS_CACHE_DIR": str(self.workdir / "cache"),
            "POSBIAS_POLL_SECONDS": "0.1",
            "POSBIAS_HEARTBEAT_SECONDS": "2",
            "POSBIAS_LEASE_SECONDS": "60",
            **env,
        }
        return subprocess.Popen(
            [str(BIN / "posbias"), "worker", "--ray-address", self.gcs, "--json", *args],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def gpus_up(self) -> float:
        """GPUs on the cluster's live nodes now, as `ray status` reports them."""
        status = subprocess.run(
            [str(BIN / "ray"), "status", f"--address={self.gcs}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
        ).stdout
        lines = [line for line in status.splitlines() if line.strip().endswith(" GPU")]
        return sum(float(line.split("/")[1].split()[0]) for line in lines)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = Path(tempfile.mkdtemp(prefix="posbias-as-"))  # short: Ray's socket paths have a length limit
    port = free_port()
    simulator = OwnAutoscalingCluster(
        head_resources={"CPU": 2}, worker_node_types={"gpu": GPU_NODE}, port=port
    )
    head = simulator.start_in(workdir)
    url = f"sqlite:///{tmp_path_factory.mktemp('autoscaling') / 'posbias.db'}"
    migrate.upgrade(url)
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in simulator.log.read_text():
            assert head.poll() is None, simulator.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "ray start --head did not come up in 120 s"
            time.sleep(0.5)
        with database.connect(url) as db:
            yield Cluster(gcs=f"127.0.0.1:{port}", workdir=workdir, db=db)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        simulator.log_file.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _events(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _as_gpu(events: Path, *, tp: int = 1) -> dict[str, Any]:
    """Job spec fields of a fake engine declared as a GPU model, recording its loads and closes."""
    return {
        "engine": {"name": "fake", "tensor_parallel_size": tp},
        "fake": {"as_gpu": True, "events_file": str(events)},
    }


def _gpu_job(
    cluster: Cluster, make_job: MakeJob, model: str, *, tp: int = 1, **fields: Any
) -> tuple[int, Path]:
    events = cluster.workdir / f"{model}.events"
    return make_job(cluster.db, model=model, **_as_gpu(events, tp=tp), **fields).job_id, events


def test_a_gpu_job_on_a_cluster_with_no_gpu_gets_a_node_from_the_autoscaler_and_completes_once(
    cluster: Cluster, make_job: MakeJob
) -> None:
    assert cluster.gpus_up() == 0, "the GPU node type has min 0: no GPU before there is work"
    job, events = _gpu_job(cluster, make_job, "gpu-model-a", batch_sizes=(2, 3), iterations=4, shard_size=2)

    summary = summary_of(cluster.worker("--until-empty"))

    assert jobs.get(cluster.db, job).status is JobStatus.done
    rows, distinct = result_rows(cluster.db, job)
    assert rows == distinct == 4 * (2 + 3), "every (trial, position) written exactly once"
    assert summary["shards_failed"] == 0 and summary["shards_written"] == 4
    # Attempts count failures only (a lapsed lease is a lapse): none failed, none lapsed.
    assert all(s.attempts == 0 and s.lapses == 0 for s in jobs.shards(cluster.db, job))
    # The one actor ran on the node the autoscaler added: Ray gave it that node's GPU.
    loads = [event for event in _events(events) if event[0] == "load"]
    assert len(loads) == 1 and loads[0][3] == "gpus=0", loads


def test_a_tensor_parallel_size_no_node_type_has_fails_its_job_at_once_naming_the_largest_node(
    cluster: Cluster, make_job: MakeJob
) -> None:
    job, events = _gpu_job(cluster, make_job, "gpu-model-tp2", tp=2, batch_sizes=(2,), iterations=2)

    summary_of(cluster.worker("--until-empty", POSBIAS_MAX_NODE_GPUS="1"))

    failed = jobs.get(cluster.db, job)
    assert failed.status is JobStatus.failed
    assert failed.error is not None and "\n" not in failed.error
    assert "tensor_parallel_size 2 needs 2 GPUs on one node" in failed.error
    assert "largest node of this cluster has 1 GPU (POSBIAS_MAX_NODE_GPUS)" in failed.error
    assert not _events(events), "no actor was started for it"


def test_node_types_published_in_rays_cluster_config_name_the_largest_node(
    cluster: Cluster, make_job: MakeJob
) -> None:
    """Ray's v2 autoscaler in releases after 2.60 publishes its node types in the GCS (Ray 2.60's do not);
    the dispatcher reads them from there. Here the test publishes this cluster's node types itself, through
    the GCS call that autoscaler makes."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    config = autoscaler_pb2.ClusterConfig()
    group = autoscaler_pb2.NodeGroupConfig(name="gpu", max_count=1)
    group.resources["CPU"], group.resources["GPU"] = 1, 1
    config.node_group_configs.append(group)
    gcs = GcsClient(address=cluster.gcs)
    gcs.report_cluster_config(config.SerializeToString())
    try:
        job, _ = _gpu_job(cluster, make_job, "gpu-model-tp2-typed", tp=2, batch_sizes=(2,), iterations=2)
        summary_of(cluster.worker("--until-empty"))
    finally:
        gcs.report_cluster_config(autoscaler_pb2.ClusterConfig().SerializeToString())
    failed = jobs.get(cluster.db, job)
    assert failed.status is JobStatus.failed and failed.error is not None
    assert "the largest node of this cluster has 1 GPU (node type 'gpu')" in failed.error


def test_without_knowing_the_node_types_a_waiting_actor_gives_its_shards_back_with_the_reason(
    cluster: Cluster, make_job: MakeJob
) -> None:
    """Ray 2.60's autoscalers publish no node types, so this is what a TP 2 job meets unless
    POSBIAS_MAX_NODE_GPUS says: its actor waits, and after the placement timeout its shards are back in the
    queue, no attempt used, the reason kept."""
    job, _ = _gpu_job(cluster, make_job, "gpu-model-tp2-waits", tp=2, batch_sizes=(2,), iterations=2)
    worker = cluster.worker(POSBIAS_PLACEMENT_TIMEOUT_SECONDS="3")
    try:
        deadline = time.monotonic() + 120
        while not any("no Ray node took" in (s.last_error or "") for s in jobs.shards(cluster.db, job)):
            assert worker.poll() is None, worker.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the waiting actor never gave its shards back"
            time.sleep(0.2)
    finally:
        # Twice: the first stops leasing, the second gives back at once what still waits for a node.
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)
        summary = summary_of(worker)
    assert summary["interrupted"] is True
    shards = jobs.shards(cluster.db, job)
    assert all(s.status is ShardStatus.queued and s.attempts == 0 for s in shards)
    assert jobs.get(cluster.db, job).status is not JobStatus.failed
    jobs.cancel(cluster.db, job)  # leave nothing for the next test's dispatcher


def test_a_job_no_node_type_can_hold_fails_after_its_waits_and_until_empty_exits(
    cluster: Cluster, make_job: MakeJob
) -> None:
    """The same TP 2 job, left to its budget: each wait past the placement timeout is charged, and after
    POSBIAS_PLACEMENT_WAITS the job fails with what was waited for; an `--until-empty` dispatcher exits."""
    job, _ = _gpu_job(cluster, make_job, "gpu-model-tp2-gives-up", tp=2, batch_sizes=(2,), iterations=2)
    worker = cluster.worker(
        "--until-empty", POSBIAS_PLACEMENT_TIMEOUT_SECONDS="2", POSBIAS_PLACEMENT_WAITS="2"
    )
    summary = summary_of(worker)

    failed = jobs.get(cluster.db, job)
    assert failed.status is JobStatus.failed and failed.error is not None and "\n" not in failed.error
    assert "no Ray node took the model's actor within 2 s" in failed.error
    assert "it needs 2 GPUs on one node and no node up has them" in failed.error
    assert failed.error.endswith("gave up after 2 waits (POSBIAS_PLACEMENT_WAITS)")
    assert all(s.attempts == 0 for s in jobs.shards(cluster.db, job))
    assert summary["shards_written"] == 0


def test_a_model_released_for_another_closes_its_engine_before_the_other_loads(
    cluster: Cluster, make_job: MakeJob
) -> None:
    """One GPU node at most, two GPU models with work: the second model's actor waits until the first,
    out of work, is released, and the first one's engine is closed (in its own actor, seen by the fake
    engine) before the second one loads on the GPU it gave up."""
    events = cluster.workdir / "two-models.events"
    first = make_job(cluster.db, model="gpu-first", **_as_gpu(events), iterations=3, priority=1).job_id
    second = make_job(cluster.db, model="gpu-second", **_as_gpu(events), iterations=3).job_id

    summary = summary_of(cluster.worker("--until-empty"))

    assert jobs.get(cluster.db, first).status is JobStatus.done
    assert jobs.get(cluster.db, second).status is JobStatus.done
    assert summary["shards_failed"] == 0
    seen = _events(events)
    assert [(what, model) for what, model, *_ in seen][:3] in (
        [("load", "gpu-first"), ("close", "gpu-first"), ("load", "gpu-second")],
        [("load", "gpu-second"), ("close", "gpu-second"), ("load", "gpu-first")],
    ), seen
    assert seen[0][2] == seen[1][2], "closed by the actor that loaded it"
    assert seen[2][3] == "gpus=0", "the other model ran on the GPU"


def _actor_node_gpus(cluster: Cluster, *, since_ms: int) -> list[float]:
    """GPUs of the node each engine actor started since `since_ms` (Unix milliseconds) was placed on, read
    from Ray's GCS by a driver of its own (this process may hold a Ray of its own already)."""
    script = (
        "import json, ray\n"
        f"ray.init(address={cluster.gcs!r}, logging_level='ERROR', log_to_driver=False)\n"
        "gpus = {n['NodeID']: n.get('Resources', {}).get('GPU', 0) for n in ray.nodes()}\n"
        "actors = ray._private.state.actors().values()\n"
        "print(json.dumps([gpus.get(a['Address']['NodeID'], -1) for a in actors\n"
        f"    if a['ActorClassName'].endswith('ShardActor') and a['StartTime'] >= {since_ms}]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    found = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True, env=env
    )
    gpus: list[float] = json.loads(found.stdout.strip().splitlines()[-1])
    return gpus


def test_a_transformers_job_on_a_gpu_device_reserves_its_gpu_and_runs_on_the_node_added_for_it(
    cluster: Cluster, make_job: MakeJob
) -> None:
    """An `hf` actor holds the engine device as a vLLM one does. It used to reserve nothing: on a GPU
    cluster it ran on any node, Ray hid the GPUs from it, and transformers ran on the CPU."""
    model = str(tiny_model(architecture="llama"))
    job = make_job(
        cluster.db, model=model, engine={"name": "hf"}, batch_sizes=(2,), iterations=2, shard_size=2
    ).job_id
    started_ms = int(time.time() * 1000)

    summary = summary_of(cluster.worker("--until-empty", POSBIAS_DEVICE="gpu"))

    assert jobs.get(cluster.db, job).status is JobStatus.done, jobs.get(cluster.db, job).error
    assert summary["shards_failed"] == 0
    rows, distinct = result_rows(cluster.db, job)
    assert rows == distinct == 2 * 2
    # The head has no GPU: an actor that reserved one ran on the node the autoscaler added.
    assert _actor_node_gpus(cluster, since_ms=started_ms) == [1]
