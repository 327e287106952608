"""deploy/ray-cluster.yaml passes Ray's own cluster-config validation (the checks `ray up` runs before it
touches a cloud), offline, and says what posbias needs of the cluster."""

from __future__ import annotations

import copy
import logging
from typing import Any

import jsonschema
import pytest
from deploy_support import DEPLOY, by_kind, load_docs
from ray.autoscaler._private.util import prepare_config, validate_config

PATH = DEPLOY / "ray-cluster.yaml"


def _config() -> dict[str, Any]:
    (config,) = load_docs(PATH)
    return config


def _prepared(config: dict[str, Any]) -> dict[str, Any]:
    # What `ray up` does before asking the cloud anything: merge the provider's defaults, fill per-node-type
    # worker bounds. (Detecting instance resources needs AWS; the file gives them explicitly.)
    logging.getLogger("ray.autoscaler").setLevel(logging.WARNING)
    prepared: dict[str, Any] = prepare_config(copy.deepcopy(config))
    return prepared


def test_passes_rays_validation() -> None:
    validate_config(_prepared(_config()))


@pytest.mark.parametrize(
    "breakage",
    ["typo in a node type", "negative resource", "head type missing", "unknown top-level key"],
)
def test_rays_validation_catches_mistakes(breakage: str) -> None:
    """The check above can fail."""
    config = _config()
    if breakage == "typo in a node type":
        config["available_node_types"]["gpu"]["min_worker"] = config["available_node_types"]["gpu"].pop(
            "min_workers"
        )
    elif breakage == "negative resource":
        config["available_node_types"]["gpu"]["resources"]["GPU"] = -1
    elif breakage == "head type missing":
        config["head_node_type"] = "nope"
    else:
        config["setup_command"] = ["true"]
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        validate_config(_prepared(config))


def test_head_runs_no_engines_and_gpu_nodes_fit_tensor_parallel_4() -> None:
    config = _prepared(_config())
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert any("--num-gpus=0" in command for command in config["head_start_ray_commands"])
    gpu_types = [t for t in types.values() if t["resources"].get("GPU", 0) > 0]
    assert gpu_types
    for node_type in gpu_types:
        assert node_type["resources"]["GPU"] >= 4
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"] <= config["max_workers"]


def test_every_node_installs_posbias_gpu_with_the_clusters_ray() -> None:
    config = _prepared(_config())
    ray_version = by_kind("RayCluster")["spec"]["rayVersion"]
    for commands in (config["head_setup_commands"], config["worker_setup_commands"]):
        install = " ".join(commands)
        assert "[gpu]" in install and "posbias" in install
        assert f'"ray[default]=={ray_version}"' in install
    assert "boto3" in " ".join(config["head_setup_commands"]), "the autoscaler on the head talks to EC2"


def test_every_node_uses_ray_token_authentication() -> None:
    """Set explicitly on every node: left unset, Ray 2.60 decides per node from whether a token file exists,
    and nodes that disagree cannot join."""
    config = _prepared(_config())
    for commands in (config["head_start_ray_commands"], config["worker_start_ray_commands"]):
        start = next(command for command in commands if "ray start" in command)
        assert "export RAY_AUTH_MODE=token;" in start
    assert config["file_mounts"]["/home/ubuntu/.ray/auth_token"] == "~/.ray/auth_token"


def test_holds_no_credentials() -> None:
    text = PATH.read_text()
    assert "POSBIAS_DATABASE_URL=" not in text
    assert "postgresql://" not in text and "postgresql+psycopg://" not in text
