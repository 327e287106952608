"""What a subprocess writes while an engine starts is kept, passes on to the original output, and its
logged exception is found: the root cause vLLM's engine core prints before the actor's generic error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from posbias.workers.engine_output import EngineOutput, root_cause

# As vLLM 0.32's engine core logs a failed start (logger.exception in EngineCoreProc.run_engine_core).
# As vLLM 0.32 logs a failed start on CPU with the engine core in a subprocess (seen here): its worker
# process fails first (WorkerProc.worker_main), then the engine core logs a pointer to it.
W = "(Worker pid=74) ERROR 12-01 22:09:10 [multiproc_executor.py:953] "
E = "(EngineCore pid=70) ERROR 12-01 22:09:13 [core.py:1510] "
LOGGED = [
    "(EngineCore pid=70) INFO 12-01 22:09:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) ...",
    W + "WorkerProc failed to start.",
    W + "Traceback (most recent call last):",
    W + '  File "vllm/model_executor/parameter.py", line 193, in load_qkv_weight',
    W + "    loaded_weight = loaded_weight.narrow(",
    W + "RuntimeError: start (0) + length (72) exceeds dimension size (64).",
    E + "EngineCore failed to start.",
    E + "Traceback (most recent call last):",
    E + "Exception: WorkerProc initialization failed due to an exception in a background process. See stack "
    "trace for root cause.",
]


def test_the_root_cause_is_the_first_exception_after_the_failed_start() -> None:
    output = EngineOutput()
    output._lines.extend(LOGGED)  # as its pipe reader keeps them: headers and all
    assert output.root_cause() == "RuntimeError: start (0) + length (72) exceeds dimension size (64)."
    # Only the engine core failed, with an exception chained: the first one is the cause.
    alone = [
        E + "EngineCore failed to start.",
        E + "ValueError: head size 36",
        E + "torch.OutOfMemoryError: x",
    ]
    output = EngineOutput()
    output._lines.extend(alone)
    assert output.root_cause() == "ValueError: head size 36"
    assert root_cause(["Engine core initialization failed. See root cause above."]) is None


def test_a_subprocess_started_while_capturing_is_kept_and_still_reaches_the_output(
    capfd: pytest.CaptureFixture[str],
) -> None:
    output = EngineOutput()
    script = "import sys; print('loading'); sys.exit('ValueError: head size 36 is not supported')"
    with output.capture():
        child = subprocess.run([sys.executable, "-c", script], check=False)
    assert child.returncode == 1
    # The readers pass each line on as they read it: what reached the output is read once they are done (under
    # load, read before, it raced them).
    assert output.drained(timeout=30), "the pipes' readers end once every writer has closed its end"
    passed_on = capfd.readouterr()
    assert "loading" in passed_on.out and "head size 36" in passed_on.err
    assert output.root_cause() == "ValueError: head size 36 is not supported"
    assert "loading" in output.lines()
