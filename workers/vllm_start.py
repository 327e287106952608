"""Starting vLLM in a worker: its environment, its arguments, and waiting for GPU memory.

On the CPU build the engine runs in-process (no engine-core subprocess, no thread binding), in float32 with
eager execution and a fixed KV cache, which is what starts fast on a small machine. On GPUs it uses the
model's dtype and, for tensor parallelism, vLLM's own multiprocessing executor: the engine lives inside a
Ray actor, and nesting Ray placement groups there is what we must avoid. The model loads text-only
(`language_model_only`): posbias sends token ids, so a multimodal checkpoint such as Gemma 3 4B+ loads no
vision tower.

On GPUs `start_llm` first waits (bounded by `WorkerConfig.gpu_memory_wait_seconds`) until its GPUs have the
memory vLLM will ask for: an engine that was just closed, or one whose actor was killed, may still be
freeing it. vLLM refuses to start below that ("Free memory on device ... is less than desired GPU memory
utilization"; through its engine-core process only as "Engine core initialization failed"), so a refused
start with the GPUs short of memory is tried again with backoff, and past the bound it is a
`RetryableError` (the shards go back to the queue), not a broken model. With the engine core in a
subprocess (every GPU) what it writes while it starts is kept (`workers/engine_output.py`): its logged
exception is the load's one-line error, and decides whether the refusal was for memory.

vLLM is imported only when an engine is built, after its environment variables are set.
"""

from __future__ import annotations

import logging
import os
import re
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from posbias.schemas import EngineOptions, PosbiasError, RetryableError, WorkerConfig, one_line
from posbias.workers.engine_output import EngineOutput
from posbias.workers.models import ResolvedModel
from posbias.workers.vllm_readback import WORKER_EXTENSION

log = logging.getLogger(__name__)

# vLLM's own refusals when a GPU lacks free memory at startup (vllm/v1/worker/utils.py, gpu_worker.py).
_MEMORY_REFUSAL = re.compile(r"Free memory on device|less than desired GPU memory utilization|out of memory")


def start_llm(
    resolved: ResolvedModel, *, options: EngineOptions, config: WorkerConfig, hf_overrides: dict[str, Any]
) -> tuple[Any, str]:
    """A `vllm.LLM` for `resolved` with the engine `options` and the config changes `hf_overrides`, and the
    device it runs on (`cpu`, `cuda`, ...). Raises `PosbiasError` (one line) when the model cannot be loaded
    here, and `RetryableError` when the GPUs lacked the memory for longer than the worker waits."""
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu and options.tensor_parallel_size > 1:
        raise PosbiasError(
            f"tensor_parallel_size {options.tensor_parallel_size} needs GPUs, but this worker has the CPU "
            "build of vLLM; set engine.tensor_parallel_size: 1 or run the job on GPU workers"
        )
    _set_vllm_environment(config, on_cpu=on_cpu)
    kwargs: dict[str, Any] = {
        "tokenizer": resolved.tokenizer,
        "revision": resolved.revision,
        "dtype": options.dtype,
        "tensor_parallel_size": options.tensor_parallel_size,
        "max_model_len": options.max_model_len,
    }
    # Workers report what they run by method name (see AttentionReport); token ids only, so no vision tower.
    kwargs["worker_extension_cls"] = WORKER_EXTENSION
    kwargs["language_model_only"] = True
    if hf_overrides:
        kwargs["hf_overrides"] = hf_overrides
    if on_cpu:
        kwargs["distributed_executor_backend"] = "uni"
        kwargs["enforce_eager"] = True
        if options.dtype == "auto":
            kwargs["dtype"] = "float32"  # bf16 matmuls are ~3.6x slower on CPUs without AMX
    else:
        kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        if options.tensor_parallel_size > 1:
            kwargs["distributed_executor_backend"] = "mp"
    kwargs.update(options.extra)
    kwargs["trust_remote_code"] = options.trust_remote_code  # the job's field alone decides

    import vllm.envs
    from vllm import LLM

    subprocess_core = bool(vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING)
    measure = not on_cpu and current_platform.is_cuda()
    gpus = options.tensor_parallel_size
    need = options.gpu_memory_utilization
    deadline = time.monotonic() + config.gpu_memory_wait_seconds
    pause = 2.0
    while True:
        short = _short_gpus(gpus, need=need) if measure else []
        if short and time.monotonic() < deadline:
            log.info("waiting for GPU memory: %s", "; ".join(short))
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, 30.0)
            continue
        output = EngineOutput()
        try:
            with output.capture() if subprocess_core else nullcontext(output):
                llm = LLM(resolved.model, **kwargs)
            break
        except Exception as exc:  # vLLM and transformers raise anything from OSError to pydantic errors
            # A subprocess engine core's failure reaches this process as a generic error: its root cause is
            # what it logged, kept by `output`.
            cause = output.root_cause() if subprocess_core else None
            refused = _memory_refusal(exc) or bool(cause and _MEMORY_REFUSAL.search(cause))
            short = _short_gpus(gpus, need=need) if measure else []
            said = f"{cause} ({_full_log(exc)})" if cause else one_line(exc)
            if not (refused or short):
                raise PosbiasError(f"cannot load model {resolved.source}: {said}") from exc
            if time.monotonic() >= deadline:
                held = "; ".join(short) or said
                waited = config.gpu_memory_wait_seconds
                raise RetryableError(
                    f"the GPUs did not have the memory vLLM asks for within {waited:.0f} s ({held}); another "
                    "engine may still hold it"
                ) from exc
            log.warning("vLLM refused to start for lack of GPU memory; trying again in %.0f s", pause)
            time.sleep(pause)
            pause = min(2 * pause, 30.0)
    device = (
        "cpu" if on_cpu else ("cuda" if current_platform.is_cuda_alike() else current_platform.device_type)
    )
    return llm, device


def _full_log(exc: BaseException) -> str:
    """Where the engine core's whole log is: this actor's Ray worker log, on its node."""
    first = one_line(exc).split(". ", 1)[0]
    try:
        import ray

        context = ray.get_runtime_context()
        actor, node = context.get_actor_id(), context.get_node_id()
    except Exception:  # not in a Ray worker
        actor = node = None
    where = f"actor {actor} on node {node}" if actor else f"process {os.getpid()}"
    return f"{first}; the full log is the Ray worker log of {where}"


def _memory_refusal(exc: BaseException) -> bool:
    """True when vLLM's error (or one it was raised from) is its refusal for lack of free GPU memory."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if _MEMORY_REFUSAL.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _short_gpus(count: int, *, need: float) -> list[str]:
    """The GPUs of this process (the first `count` it may use) whose free memory is below `need` of their
    total, as vLLM requires at startup, e.g. `GPU 3: 20.1 of 79.6 GiB free`. Read through NVML, so no CUDA
    context is made in this process; empty when NVML cannot say."""
    try:
        from vllm.platforms import current_platform
        from vllm.utils.import_utils import import_pynvml

        pynvml = import_pynvml()  # type: ignore[no-untyped-call]
        pynvml.nvmlInit()
    except Exception:
        return []
    short = []
    try:
        for device in range(count):
            physical = current_platform.device_id_to_physical_device_id(device)
            memory = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(physical))
            if memory.free < need * memory.total:
                free, total = memory.free / 2**30, memory.total / 2**30
                short.append(f"GPU {physical}: {free:.1f} of {total:.1f} GiB free")
    except Exception:
        return []
    finally:
        pynvml.nvmlShutdown()
    return short


def _set_vllm_environment(config: WorkerConfig, *, on_cpu: bool) -> None:
    """vLLM and torch read these from the environment; the worker's config is their only source."""
    import vllm.envs

    # Compile caches on the node's own disk when the config names one: on the shared model volume they are
    # slow to read and write, and shared between GPU types whose kernels differ.
    cache = Path(config.compile_cache_dir or config.cache_dir).expanduser()
    os.environ["VLLM_CACHE_ROOT"] = str(cache / "vllm")
    # torch compiles a sampler kernel with g++ on first use (~35 s on CPU); keep it across restarts.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    if on_cpu:
        import torch

        threads = config.cpu_threads or _usable_cpus()
        # In-process: the engine core shares this process, so startup is seconds, not a subprocess spawn.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # Binding OMP threads to cores needs the multiprocessing executor and would pin the whole actor.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_gib)
        # Without OMP_NUM_THREADS vLLM drops torch to one thread for serving, which with `nobind` would
        # run every matmul on one core.
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    # A previous engine in this process froze vLLM's view of the environment; let it see ours.
    if hasattr(vllm.envs, "disable_envs_cache"):
        vllm.envs.disable_envs_cache()


def _usable_cpus() -> int:
    """Cores this process may run on (a container's cgroup or affinity mask, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
