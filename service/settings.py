"""The one settings object. Read once (environment variables `POSBIAS_*`, optionally a `.env`), then passed
down explicitly; no other module reads the environment."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from posbias.schemas import WorkerConfig


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "posbias"


class Settings(BaseSettings):
    """posbias configuration. Every field is the environment variable `POSBIAS_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="POSBIAS_", env_file=".env", extra="ignore")

    database_url: str = Field(
        "sqlite:///posbias.db",
        description="SQLAlchemy URL of the store: SQLite (default, `posbias.db` here) or "
        "`postgresql+psycopg://user:pass@host/db`.",
    )
    ray_address: str = Field(
        "local",
        description="Ray cluster: `local` (start one here), `auto` (join this node's), or an address.",
    )
    mmlu_dir: Path | None = Field(
        None,
        description="Local MMLU copy (release CSVs or cais/mmlu JSONL); used when the hub is unreachable.",
    )
    cache_dir: Path = Field(
        default_factory=_default_cache_dir, description="Cache for converted models and downloaded data."
    )
    lease_seconds: float = Field(
        300.0, gt=0, description="How long a leased shard stays ours without a heartbeat."
    )
    heartbeat_seconds: float = Field(30.0, gt=0, description="How often in-flight shards are heartbeated.")
    poll_seconds: float = Field(1.0, gt=0, description="How often an idle dispatcher looks for new work.")
    worker_id: str | None = Field(None, description="Lease owner name; host and process id when not set.")
    cpu_kvcache_gib: int = Field(2, ge=1, description="KV cache for the vLLM CPU build, in GiB.")
    cpu_threads: int | None = Field(None, ge=1, description="Threads for the vLLM CPU build.")
    actors_per_model: int | None = Field(
        None,
        ge=1,
        description="Actors per loaded model. Unset: one on the CPU build; on GPUs one, plus one more "
        "waiting for a node whenever the model's actors are all busy (up to 16), so the autoscaler sees "
        "the demand.",
    )
    device: Literal["auto", "gpu", "cpu"] = Field(
        "auto",
        description="Where vLLM engines run: `gpu` (an actor reserves tensor_parallel_size GPUs), `cpu` (the "
        "CPU build), or `auto`: from the vLLM build installed where the dispatcher runs.",
    )
    max_node_gpus: int | None = Field(
        None,
        ge=0,
        description="GPUs on the largest node the cluster has or its autoscaler can add; a job whose tensor "
        "parallel size is larger fails at once. Unset: read from Ray where it says (the nodes of a cluster "
        "without an autoscaler, or an autoscaler that publishes its node types).",
    )
    placement_timeout_seconds: float = Field(
        900.0,
        gt=0,
        description="How long a model's actor may wait for a node (the autoscaler adding one, or GPUs "
        "freeing up) before its shards go back to the queue with the reason.",
    )
    gpu_memory_wait_seconds: float = Field(
        120.0,
        ge=0,
        description="How long a GPU engine waits for the memory a previous engine held before it loads.",
    )
    webhook_url: str | None = Field(None, description="URL to POST a schedule's regression verdicts to.")
    debug: bool = Field(False, description="Show tracebacks.")

    def worker_config(self) -> WorkerConfig:
        """What a worker needs of these settings."""
        return WorkerConfig(
            cache_dir=str(self.cache_dir),
            cpu_kvcache_gib=self.cpu_kvcache_gib,
            cpu_threads=self.cpu_threads,
            gpu_memory_wait_seconds=self.gpu_memory_wait_seconds,
        )
