"""The one settings object. Read once (environment variables `POSBIAS_*`, optionally a `.env`), then passed
down explicitly; no other module reads the environment."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from annotated_types import Ge, Gt, Le, Lt
from pydantic import Field, ModelWrapValidatorHandler, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from posbias.schemas import PosbiasError, UsageError, WorkerConfig

ENV_FILE = ".env"
MAX_ENV_FILE_BYTES = 1 << 20
"""A `.env` larger than this is a mistake (it holds a few settings)."""


class SettingsError(UsageError):
    """A setting that cannot be used as given (from `POSBIAS_*`, `.env` or `Settings(...)`): one line naming
    the setting, its variable, and what it must be."""


HIDDEN_VALUES = frozenset({"database_url", "webhook_url"})
"""Settings whose value an error never quotes: they may hold a password or a token."""


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "posbias"


class Settings(BaseSettings):
    """posbias configuration. Every field is the environment variable `POSBIAS_<FIELD>`."""

    model_config = SettingsConfigDict(
        env_prefix="POSBIAS_", env_file=ENV_FILE, extra="ignore", allow_inf_nan=False
    )

    database_url: str = Field(
        "sqlite:///posbias.db",
        min_length=1,
        max_length=4096,
        description="SQLAlchemy URL of the store: SQLite (default, `posbias.db` here) or "
        "`postgresql+psycopg://user:pass@host/db`.",
    )
    ray_address: str = Field(
        "local",
        min_length=1,
        max_length=1000,
        description="Ray cluster: `local` (start one here), `auto` (join this node's), or an address.",
    )
    ray_connect_seconds: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="How long connecting to Ray (or starting a local one) may take before the dispatcher "
        "gives up with an error.",
    )
    mmlu_dir: Path | None = Field(
        None,
        description="Local MMLU copy (release CSVs or cais/mmlu JSONL); used when the hub is unreachable.",
    )
    datasets_dir: Path | None = Field(
        None,
        description="Folder of local copies of the named datasets, one subfolder each "
        "(`arc-challenge/test.jsonl`, ...; `posbias datasets` lists them); a dataset with a copy there is "
        "read from it, not from the hub.",
    )
    cache_dir: Path = Field(
        default_factory=_default_cache_dir, description="Cache for converted models and downloaded data."
    )
    lease_seconds: float = Field(
        30.0,
        gt=0,
        le=86_400,
        description="How long a leased shard stays ours without a heartbeat (a few heartbeats).",
    )
    heartbeat_seconds: float = Field(
        10.0, gt=0, le=3600, description="How often in-flight shards are heartbeated."
    )
    poll_seconds: float = Field(
        1.0, gt=0, le=3600, description="How often an idle dispatcher looks for new work."
    )
    drain_seconds: float = Field(
        300.0,
        ge=0,
        le=86_400,
        description="On SIGTERM, how long in-flight shards may run on before they are released.",
    )
    store_outage_seconds: float = Field(
        120.0,
        gt=0,
        le=86_400,
        description="How long a dispatcher keeps retrying a store it cannot reach or write before it exits.",
    )
    max_trials: int = Field(1_000_000, ge=1, le=100_000_000, description="Trials one job may plan at most.")
    worker_id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Lease owner name; host and process id when not set.",
    )
    cpu_kvcache_gib: int = Field(2, ge=1, le=4096, description="KV cache for the vLLM CPU build, in GiB.")
    cpu_threads: int | None = Field(None, ge=1, le=4096, description="Threads for the vLLM CPU build.")
    actors_per_model: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Actors per loaded model. Unset: one on the CPU build; on GPUs one, plus one more "
        "waiting for a node whenever the model's actors are all busy (up to 16), so the autoscaler sees "
        "the demand.",
    )
    device: Literal["auto", "gpu", "cpu"] = Field(
        "auto",
        description="Where vLLM and transformers (`hf`) engines run: `gpu` (an actor reserves "
        "tensor_parallel_size GPUs), `cpu` (the CPU build), or `auto`: from the vLLM build installed where "
        "the dispatcher runs.",
    )
    max_node_gpus: int | None = Field(
        None,
        ge=0,
        le=4096,
        description="GPUs on the largest node the cluster has or its autoscaler can add; a job whose tensor "
        "parallel size is larger fails at once. Unset: read from Ray where it says (the nodes of a cluster "
        "without an autoscaler, or an autoscaler that publishes its node types).",
    )
    compile_cache_dir: Path | None = Field(
        None,
        description="Where workers keep vLLM's and torch's compile caches: a folder on each worker node's "
        "local disk (the manifests set /tmp/posbias-compile), not the shared model volume; unset: the cache "
        "folder.",
    )
    placement_timeout_seconds: float = Field(
        1800.0,
        gt=0,
        description="How long a model's actor may wait for a node (the autoscaler adding one, the node "
        "pulling the image and starting, or GPUs freeing up) before its shards go back to the queue with the "
        "reason. A cold GPU node takes minutes to be provisioned and more to pull a vLLM image of about "
        "10 GB; 1,800 s covers both with room.",
    )
    placement_waits: int = Field(
        3,
        ge=1,
        le=1000,
        description="Times a shard may go back to the queue because its model's actor waited past the "
        "placement timeout or was refused GPU memory; then its job fails with the reason.",
    )
    fixed_cluster: bool = Field(
        False,
        description="The Ray nodes up now are all the cluster will have (compose's single machine): a job "
        "whose actor no node can hold fails at once. Always so for a Ray this process starts.",
    )
    gpu_memory_wait_seconds: float = Field(
        120.0,
        ge=0,
        description="How long a GPU engine waits for the memory a previous engine held before it loads.",
    )
    webhook_url: str | None = Field(
        None,
        max_length=4096,
        description="http(s) URL to POST a schedule's regression verdicts to; a `user:password@` in it is "
        "sent as basic authentication. Redirects are not followed.",
    )
    debug: bool = Field(False, description="Show tracebacks.")
    verbose: bool = Field(
        False,
        description="Show Ray's notices and its workers' logs on the terminal (otherwise they stay in Ray's "
        "log folder, /tmp/ray/session_latest/logs for a local Ray).",
    )

    @field_validator("webhook_url")
    @classmethod
    def _check_webhook_url(cls, value: str | None) -> str | None:
        # Here, when it is set, not when the first verdict is posted weeks later.
        if not value:
            return None
        check_webhook_url(value)
        return value

    @model_validator(mode="after")
    def _check_heartbeat(self) -> Self:
        if self.heartbeat_seconds >= self.lease_seconds:
            # Every lease would lapse between two heartbeats, and another dispatcher could take the shard.
            raise ValueError(
                f"heartbeat_seconds: {self.heartbeat_seconds:g} is not below lease_seconds "
                f"{self.lease_seconds:g}, so every lease would lapse between heartbeats; make "
                "POSBIAS_HEARTBEAT_SECONDS a third of POSBIAS_LEASE_SECONDS or less"
            )
        return self

    @model_validator(mode="after")
    def _check_texts(self) -> Self:
        for name, value in self:
            text = str(value) if isinstance(value, str | Path) else None
            if text is None:
                continue
            if "\x00" in text:
                raise ValueError(f"{name}: holds a NUL character; remove it")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"{name}: is not valid UTF-8; write it as UTF-8 text") from None
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _one_line(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # Defined last, so it wraps the checks above too. A SettingsError is no ValueError, so pydantic
        # passes it on as it is: `Settings(lease_seconds=inf)` raises the line the command prints for
        # POSBIAS_LEASE_SECONDS=inf.
        try:
            return handler(data)
        except ValidationError as exc:
            raise SettingsError(describe_setting_error(exc, fields=cls.model_fields)) from None

    def worker_config(self) -> WorkerConfig:
        """What a worker needs of these settings."""
        return WorkerConfig(
            cache_dir=str(self.cache_dir),
            compile_cache_dir=str(self.compile_cache_dir) if self.compile_cache_dir is not None else None,
            cpu_kvcache_gib=self.cpu_kvcache_gib,
            cpu_threads=self.cpu_threads,
            gpu_memory_wait_seconds=self.gpu_memory_wait_seconds,
        )


def check_webhook_url(url: str) -> None:
    """Raise `ValueError` (a message that never quotes the URL: it may hold a token) unless `url` is one
    posbias posts to: http or https, a host, a port in range, no whitespace or control character."""
    if any(char.isspace() or ord(char) < 0x20 or char == "\x7f" for char in url):
        raise ValueError("holds whitespace or a control character; write it on one line, percent-encoded")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError when out of range)
    except ValueError:
        raise ValueError("is not a URL (a bad IPv6 address or port); write http(s)://host/path") from None
    if parts.scheme not in {"http", "https"}:
        shown = f"a {parts.scheme[:20]}: URL" if parts.scheme else "no URL"
        raise ValueError(f"must be an http:// or https:// URL (got {shown})")
    if not parts.hostname:
        raise ValueError("names no host; write http(s)://host/path")


def load_settings(**overrides: Any) -> Settings:
    """The settings of this process: `POSBIAS_*` variables, then `.env` in the working folder.

    A `.env` that is not a regular UTF-8 file of at most `MAX_ENV_FILE_BYTES`, or has a line that cannot be
    parsed, and any invalid value, is a `PosbiasError` naming it (rather than a traceback in every command).
    """
    _check_env_file(Path(ENV_FILE))
    return Settings(**overrides)  # SettingsError (a PosbiasError) names a setting that will not do


def describe_setting_error(exc: ValidationError, *, fields: dict[str, FieldInfo]) -> str:
    """One line for the first setting pydantic refused: the setting and its variable, the value (unless it
    may hold a secret), what it must be, and the fix, e.g. `setting POSBIAS_LEASE_SECONDS (lease_seconds) is
    inf: it must be a finite number above 0 and at most 86,400; set it so, or unset it for the default, 30`.
    """
    first = exc.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    loc = first["loc"]
    name = str(loc[0]) if loc else ""
    shown = ""
    if not name:  # a check over the whole object: its message starts with the setting's name
        head, _, rest = message.partition(": ")
        if head in fields:
            name, message = head, rest
    elif name not in HIDDEN_VALUES:
        value = first.get("input")
        text = repr(value) if isinstance(value, str) else str(value)
        shown = f" is {text if len(text) <= 40 else text[:37] + '...'}"
    field = fields.get(name)
    if field is None:
        return f"invalid POSBIAS_* setting: {message}"
    what = f"setting POSBIAS_{name.upper()} ({name}){shown}"
    must = _numeric_bounds(field)
    if must is not None and first["type"] in _NUMBER_ERRORS:
        message = f"it must be {must}"
    default = field.get_default(call_default_factory=True)
    unset = ", or unset it" if default is None else f", or unset it for the default, {default}"
    if must is not None and first["type"] in _NUMBER_ERRORS:
        return f"{what}: {message}; set it so{unset}"
    return f"{what}: {message}" + (f"; fix it{unset}" if loc else "")


_NUMBER_ERRORS = frozenset(
    {
        "finite_number",
        "float_parsing",
        "float_type",
        "int_parsing",
        "int_type",
        "int_from_float",
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
    }
)


def _numeric_bounds(field: FieldInfo) -> str | None:
    """`a finite number above 0 and at most 86,400`, from a numeric field's constraints; None otherwise."""
    kinds = {float: "a finite number", int: "a whole number"}
    annotation = field.annotation
    kind = kinds.get(annotation) if isinstance(annotation, type) else None
    if kind is None:
        args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
        kind = kinds.get(args[0]) if len(args) == 1 else None
    if kind is None:
        return None
    words = []
    for bound in field.metadata:
        if isinstance(bound, Gt):
            words.append(f"above {bound.gt:,}")
        elif isinstance(bound, Ge):
            words.append(f"at least {bound.ge:,}")
        elif isinstance(bound, Lt):
            words.append(f"below {bound.lt:,}")
        elif isinstance(bound, Le):
            words.append(f"at most {bound.le:,}")
    return " ".join([kind, " and ".join(words)]).strip()


def _check_env_file(file: Path) -> None:
    try:
        info = file.stat()
    except FileNotFoundError:
        return
    except OSError as exc:  # e.g. a symlink loop, which resolve() could not name either
        raise PosbiasError(
            f"cannot read {file.absolute()}: {exc.strerror}; remove it, or make it a file of KEY=value lines"
        ) from None
    where = file.resolve()
    if not stat.S_ISREG(info.st_mode):
        raise PosbiasError(f"{where} is not a regular file: remove it, or make it a file of KEY=value lines")
    if info.st_size > MAX_ENV_FILE_BYTES:
        raise PosbiasError(f"{where} is {info.st_size:,} bytes: a settings file holds a few KEY=value lines")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise PosbiasError(f"cannot read {where}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PosbiasError(
            f"{where} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): save it as UTF-8"
        ) from None
    if "\x00" in text:
        raise PosbiasError(f"{where} holds a NUL character: it must be a text file of KEY=value lines")
    from io import StringIO

    from dotenv.parser import parse_stream

    for binding in parse_stream(StringIO(text)):
        if binding.error:
            line = binding.original.line
            raise PosbiasError(f"{where}, line {line}: not a KEY=value line; fix or remove it")
