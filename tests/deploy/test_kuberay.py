"""deploy/kuberay: the objects are valid for the Kubernetes API and KubeRay's CRDs (offline, strict: unknown
fields fail), and they say what posbias needs: GPUs where the engines run and nowhere else, the database URL
from the Secret and only where the store is used, one dispatcher cluster the RayJob can find."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_support import (
    DOCKER,
    K8S_VERSIONS,
    KUBERAY,
    REPO,
    by_kind,
    containers,
    env_var,
    image_name,
    kube_objects,
    load_docs,
    pod_specs,
    validate_any,
)

OBJECTS = kube_objects()
SECRET_NAME, SECRET_KEY = "posbias-db", "database-url"


def _id(item: tuple[Path, dict[str, Any]]) -> str:
    return f"{item[0].name}:{item[1]['kind']}/{item[1]['metadata']['name']}"


def test_every_file_under_deploy_parses_as_yaml() -> None:
    files = sorted((REPO / "deploy").rglob("*.yaml"))
    assert len(files) >= 8
    for path in files:
        assert load_docs(path), f"{path} holds no YAML document"


def test_the_manifests_hold_the_objects_the_runbook_names() -> None:
    kinds = sorted(f"{obj['kind']}/{obj['metadata']['name']}" for _, obj in OBJECTS)
    assert kinds == [
        "CronJob/posbias-schedule-tick",
        "Job/posbias-migrate",
        "NetworkPolicy/posbias-ray-head",
        "NetworkPolicy/posbias-ray-workers",
        "PersistentVolumeClaim/posbias-model-cache",
        "RayCluster/posbias",
        "RayJob/posbias-worker",
        "Secret/posbias-db",
        "Secret/posbias-endpoint",
        "Secret/posbias-hf",
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("item", OBJECTS, ids=_id)
def test_object_matches_its_schema(item: tuple[Path, dict[str, Any]], version: str) -> None:
    validate_any(item[1], version)


def _misspell(obj: dict[str, Any], path: list[str | int], wrong: str) -> dict[str, Any]:
    """A copy of `obj` where the field at `path` is renamed `wrong`."""
    broken = copy.deepcopy(obj)
    parent: Any = broken
    for step in path[:-1]:
        parent = parent[step]
    parent[wrong] = parent.pop(path[-1])
    return broken


@pytest.mark.parametrize(
    ("kind", "path", "wrong"),
    [
        ("RayCluster", ["spec", "workerGroupSpecs", 0, "minReplicas"], "minReplica"),
        ("RayCluster", ["spec", "enableInTreeAutoscaling"], "enableInTreeAutoScaling"),
        (
            "RayCluster",
            ["spec", "headGroupSpec", "template", "spec", "containers", 0, "resources"],
            "resource",
        ),
        (
            "RayCluster",
            ["spec", "workerGroupSpecs", 0, "template", "spec", "volumes", 0, "emptyDir", "medium"],
            "mediums",
        ),
        ("RayJob", ["spec", "clusterSelector"], "clusterSelectors"),
        ("RayJob", ["spec", "submitterPodTemplate", "spec", "restartPolicy"], "restartpolicy"),
        ("CronJob", ["spec", "concurrencyPolicy"], "concurrency"),
        ("CronJob", ["spec", "jobTemplate", "spec", "template", "spec", "containers", 0, "args"], "arg"),
        ("Job", ["spec", "template", "spec", "containers", 0, "env", 0, "valueFrom"], "valuefrom"),
        ("NetworkPolicy", ["spec", "podSelector"], "podselector"),
        ("NetworkPolicy", ["spec", "ingress", 0, "from", 0, "podSelector"], "podSelectors"),
        ("PersistentVolumeClaim", ["spec", "accessModes"], "accessMode"),
        ("RayCluster", ["spec", "authOptions", "mode"], "modes"),
        (
            "RayCluster",
            ["spec", "headGroupSpec", "template", "spec", "initContainers", 0, "args"],
            "arg",
        ),
    ],
)
def test_the_schema_check_catches_a_misspelled_field(kind: str, path: list[str | int], wrong: str) -> None:
    """The validation above is strict: a typo anywhere, pod templates included, fails it."""
    name = "posbias-ray-head" if kind == "NetworkPolicy" else None
    broken = _misspell(by_kind(kind, name), path, wrong)
    with pytest.raises(jsonschema.ValidationError):
        validate_any(broken, K8S_VERSIONS[-1])


def test_the_schema_check_catches_a_wrong_type() -> None:
    cluster = copy.deepcopy(by_kind("RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"] = "4"
    with pytest.raises(jsonschema.ValidationError):
        validate_any(cluster, K8S_VERSIONS[-1])


# --- what posbias needs of them ---------------------------------------------------------------------------


def _gpus(container: dict[str, Any]) -> tuple[int, int]:
    resources = container.get("resources", {})
    return (
        int(resources.get("requests", {}).get("nvidia.com/gpu", 0)),
        int(resources.get("limits", {}).get("nvidia.com/gpu", 0)),
    )


def _largest_tensor_parallel_in_runbook() -> int:
    sizes = re.findall(r"--tensor-parallel-size[ =](\d+)", (REPO / "deploy" / "README.md").read_text())
    assert sizes, "the runbook shows a tensor-parallel submit"
    return max(int(size) for size in sizes)


def test_head_runs_no_engines_and_gpu_workers_fit_the_runbooks_tensor_parallel_job() -> None:
    cluster = by_kind("RayCluster")["spec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert all(_gpus(c) == (0, 0) for c in head["template"]["spec"]["containers"])

    tp = _largest_tensor_parallel_in_runbook()
    (group,) = cluster["workerGroupSpecs"]
    (worker,) = group["template"]["spec"]["containers"]
    requests, limits = _gpus(worker)
    # One actor reserves tp GPUs on one pod: a pod with fewer could never host it.
    assert requests == limits >= tp
    # vLLM's tensor-parallel processes share tensors through /dev/shm, which must be memory-backed and big.
    volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
    shm = next(m for m in worker["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert volumes[shm["name"]]["emptyDir"]["medium"] == "Memory"


def test_gpu_worker_group_autoscales_within_bounds() -> None:
    cluster = by_kind("RayCluster")["spec"]
    assert cluster["enableInTreeAutoscaling"] is True
    for group in cluster["workerGroupSpecs"]:
        assert 0 <= group["minReplicas"] <= group["maxReplicas"]
        assert group["maxReplicas"] >= 1
        assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]


def test_rayjob_runs_the_dispatcher_on_the_existing_cluster() -> None:
    job = by_kind("RayJob")["spec"]
    cluster = by_kind("RayCluster")
    # KubeRay reads the cluster's name from this one selector key.
    assert job["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert "rayClusterSpec" not in job
    assert not job.get("shutdownAfterJobFinishes", False), "the cluster is shared; the job must not delete it"
    assert job["entrypoint"].split()[:4] == ["posbias", "worker", "--ray-address", "auto"]
    assert "--until-empty" in job["entrypoint"].split()


def test_schedule_tick_never_overlaps_itself() -> None:
    cron = by_kind("CronJob")["spec"]
    assert cron["concurrencyPolicy"] == "Forbid"
    minute = cron["schedule"].split()[0]
    assert len(cron["schedule"].split()) == 5
    period = int(minute.removeprefix("*/")) * 60 if minute.startswith("*/") else 3600
    assert cron["jobTemplate"]["spec"]["activeDeadlineSeconds"] < period


def _is_secret_ref(entry: dict[str, Any] | None) -> bool:
    if entry is None or "value" in entry:
        return False
    ref = entry.get("valueFrom", {}).get("secretKeyRef", {})
    return bool(ref.get("name") == SECRET_NAME and ref.get("key") == SECRET_KEY and not ref.get("optional"))


def test_database_url_comes_from_the_secret_wherever_the_store_is_used() -> None:
    """The head (where the dispatcher runs as a Ray job), the migration and the schedule tick read the URL
    from the Secret; nothing carries it as a literal."""
    users = {"RayCluster/posbias head ray-head", "Job/posbias-migrate template migrate"}
    users.add("RayCluster/posbias head wait-for-schema")
    users.add("CronJob/posbias-schedule-tick jobTemplate tick")
    seen = set()
    for _, obj in OBJECTS:
        for where, container in containers(obj):
            entry = env_var(container, "POSBIAS_DATABASE_URL")
            if entry is not None:
                assert _is_secret_ref(entry), f"{where}: POSBIAS_DATABASE_URL must be a secretKeyRef"
                seen.add(where)
    assert seen == users


def test_gpu_workers_and_the_submitter_hold_no_database_credentials() -> None:
    cluster = by_kind("RayCluster")
    job = by_kind("RayJob")
    for where, container in [*containers(cluster), *containers(job)]:
        if "head" in where:
            continue
        names = {entry["name"] for entry in container.get("env", [])}
        assert "POSBIAS_DATABASE_URL" not in names, where
        assert not container.get("envFrom"), f"{where}: envFrom could bring in the database Secret"


def test_every_secret_reference_names_a_key_of_the_example_secret() -> None:
    secrets = {
        obj["metadata"]["name"]: set(obj["stringData"]) for obj in load_docs(KUBERAY / "secret.example.yaml")
    }
    for _, obj in OBJECTS:
        for where, container in containers(obj):
            for entry in container.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets.get(ref["name"], set()), f"{where}: {ref}"


def test_example_secret_holds_placeholders_only() -> None:
    for secret in load_docs(KUBERAY / "secret.example.yaml"):
        assert "data" not in secret, "base64 `data` would hide what is in it; use stringData"
        for key, value in secret["stringData"].items():
            assert "CHANGE-ME" in value, f"{secret['metadata']['name']}/{key} is not an obvious placeholder"


def test_pods_run_as_non_root() -> None:
    for _, obj in OBJECTS:
        for where, pod in pod_specs(obj):
            context = pod.get("securityContext", {})
            assert context.get("runAsNonRoot") is True, f"{obj['kind']} {where}"
            assert context.get("runAsUser", 0) != 0, f"{obj['kind']} {where}"


def test_ray_version_matches_the_images() -> None:
    """Every Ray node must run the same Ray; KubeRay needs to know which."""
    ray_version = by_kind("RayCluster")["spec"]["rayVersion"]
    gpu = (DOCKER / "Dockerfile.gpu").read_text()
    assert f"ARG RAY_VERSION={ray_version}\n" in gpu
    assert f"RAY_VERSION={ray_version} " in (DOCKER / "install-cpu.sh").read_text()
    assert f'"ray[default]=={ray_version}"' in (REPO / "deploy" / "ray-cluster.yaml").read_text()


# --- kustomization ---------------------------------------------------------------------------------------


def _kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((KUBERAY / "kustomization.yaml").read_text())
    return loaded


def test_kustomization_covers_every_manifest_but_the_example_secret() -> None:
    listed = set(_kustomization()["resources"])
    on_disk = {p.name for p in KUBERAY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk - {"secret.example.yaml"}


def test_kustomization_sets_every_image_the_manifests_use() -> None:
    names = {image["name"] for image in _kustomization()["images"]}
    used = {image_name(c["image"]) for _, obj in OBJECTS for _, c in containers(obj)}
    assert used == names


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) not found")
def test_kustomize_renders_with_the_registry_images_in_every_pod() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(KUBERAY)], capture_output=True, text=True, check=True
    ).stdout
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    new_names = {image["newName"] for image in _kustomization()["images"]}
    images = [c["image"] for obj in objects for _, c in containers(obj)]
    assert len(images) == 6
    assert all(image.split("@sha256:")[0] in new_names for image in images), images
    assert {obj["metadata"]["namespace"] for obj in objects} == {"posbias"}
    for obj in objects:
        validate_any(obj, K8S_VERSIONS[-1])


# --- hardening ---------------------------------------------------------------------------------------------


def _ray_containers() -> list[tuple[str, dict[str, Any]]]:
    cluster = by_kind("RayCluster")
    spec = cluster["spec"]
    groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
    return [(where, c) for where, group in groups for c in group["template"]["spec"]["containers"]]


def test_every_ray_node_cleans_up_its_workers_process_groups() -> None:
    """vLLM's engine-core and tensor-parallel processes are children of a posbias actor: Ray kills a worker's
    process group when the worker exits only with this on, on every node (it is read by each raylet)."""
    for where, container in _ray_containers():
        entry = env_var(container, "RAY_process_group_cleanup_enabled")
        assert entry is not None and entry.get("value") == "true", where
    ray_up = (REPO / "deploy" / "ray-cluster.yaml").read_text()
    assert ray_up.count("export RAY_process_group_cleanup_enabled=true;") == 2, "head and worker starts"
    compose = load_docs(REPO / "deploy" / "compose.yaml")[0]
    assert compose["services"]["ray-head"]["environment"]["RAY_process_group_cleanup_enabled"] == "true"


def test_ray_token_authentication_is_on_and_the_head_is_fenced_off() -> None:
    cluster = by_kind("RayCluster")
    assert cluster["spec"]["authOptions"] == {"mode": "token"}
    head = by_kind("NetworkPolicy", "posbias-ray-head")["spec"]
    assert head["podSelector"]["matchLabels"] == {
        "ray.io/cluster": cluster["metadata"]["name"],
        "ray.io/node-type": "head",
    }
    assert head["policyTypes"] == ["Ingress"]
    sources = [source for rule in head["ingress"] for source in rule["from"]]
    assert {"ray.io/cluster": "posbias"} in [s.get("podSelector", {}).get("matchLabels") for s in sources]
    # The RayJob's submitter carries labels that one rule admits, on the job API's port.
    submitter = by_kind("RayJob")["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    admitted = [
        rule
        for rule in head["ingress"]
        for source in rule["from"]
        if set(source.get("podSelector", {}).get("matchLabels", {}).items()) <= set(submitter.items())
        and "podSelector" in source
    ]
    assert any(8265 in [p["port"] for p in rule.get("ports", [])] for rule in admitted)
    workers = by_kind("NetworkPolicy", "posbias-ray-workers")["spec"]
    assert workers["podSelector"]["matchLabels"]["ray.io/node-type"] == "worker"
    assert [s["podSelector"]["matchLabels"] for r in workers["ingress"] for s in r["from"]] == [
        {"ray.io/cluster": "posbias"}
    ]


def test_gpu_workers_keep_the_weights_on_the_shared_volume_and_request_their_disk() -> None:
    (group,) = by_kind("RayCluster")["spec"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    (worker,) = pod["containers"]
    cache = next(m for m in worker["volumeMounts"] if m["mountPath"] == "/home/posbias/.cache")
    volume = next(v for v in pod["volumes"] if v["name"] == cache["name"])
    claim = by_kind("PersistentVolumeClaim")
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "pods on several nodes mount it at once"
    assert "ephemeral-storage" in worker["resources"]["requests"]
    assert "ephemeral-storage" in worker["resources"]["limits"]


def test_the_dispatcher_starts_only_on_a_migrated_store() -> None:
    """The head (where the RayJob runs the dispatcher) waits in an init container for the schema the
    migration Job brings, so applying everything at once cannot start a dispatcher on an old schema."""
    head = by_kind("RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]
    (init,) = head["initContainers"]
    assert init["args"][:3] == ["db", "current", "--wait"]
    assert image_name(init["image"]) == "posbias-gpu"
    assert _is_secret_ref(env_var(init, "POSBIAS_DATABASE_URL"))


def test_the_head_knows_the_largest_gpu_pod() -> None:
    """POSBIAS_MAX_NODE_GPUS (on the head, where the dispatcher runs) is the GPU worker pods' GPU count, so a
    job with a larger tensor parallel size fails at once rather than waiting for a pod that never comes."""
    head = dict(_ray_containers())["head"]
    entry = env_var(head, "POSBIAS_MAX_NODE_GPUS")
    assert entry is not None
    (group,) = by_kind("RayCluster")["spec"]["workerGroupSpecs"]
    (worker,) = group["template"]["spec"]["containers"]
    assert int(entry["value"]) == max(_gpus(worker))


def test_images_are_referenced_by_digest() -> None:
    for image in _kustomization()["images"]:
        assert "newTag" not in image, image
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", image["digest"]), image
