"""`posbias serve MODEL`: the installed vLLM's OpenAI-compatible server for a model, started the way this
environment can (the CPU build's own `vllm` command fails with `PackageNotFoundError: vllm`), with the CPU
build's settings when that is the build installed (`posbias.serve_command`)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
from typing import Annotated, Any

import typer

import posbias
from posbias.cli.common import JsonOpt, err, out, print_json, settings_of
from posbias.cli.errors import BadUsage


def register(app: typer.Typer) -> None:
    """Add `serve` to the app."""
    app.command()(serve)


def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="Hub id or local model folder.", show_default=False)],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65_535)] = 8000,
    served_model_name: Annotated[
        str | None,
        typer.Option(help="The model's name on the server (a job's --endpoint-model).", show_default="MODEL"),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(help="Context length of the server's engine.", min=16, show_default="the model's"),
    ] = None,
    vllm_args: Annotated[
        str | None,
        typer.Option(
            help="Further arguments for vLLM's server, as one string, e.g. '--seed 1'.", show_default=False
        ),
    ] = None,
    print_command: Annotated[
        bool,
        typer.Option(
            "--print-command", help="Print the command and its environment; start nothing (--json: as JSON)."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Start vLLM's OpenAI-compatible server for MODEL here and wait until it stops (Ctrl-C stops it); jobs
    then use it with --base-url.

    Example: posbias serve ./tiny-gemma2 --port 8000   then   posbias run --model ./tiny-gemma2 --base-url
    http://127.0.0.1:8000/v1 --batch-sizes 1,5 --iterations 4
    """
    try:
        extra = tuple(shlex.split(vllm_args or ""))
    except ValueError as exc:
        raise BadUsage(f"--vllm-args: {exc}") from None
    command = posbias.serve_command(
        model,
        host=host,
        port=port,
        served_model=served_model_name,
        max_model_len=max_model_len,
        extra=extra,
        settings=settings_of(ctx),
    )
    if print_command or as_json:
        if as_json:
            print_json(
                {
                    "argv": command.argv,
                    "env": command.env,
                    "base_url": command.base_url,
                    "served_model": command.served_model,
                }
            )
        else:
            shown = " ".join(f"{key}={shlex.quote(value)}" for key, value in command.env.items())
            out.print(f"{shown} {shlex.join(command.argv)}".strip(), markup=False)
        return
    err.print(
        f"serving {command.served_model} at {command.base_url} (vLLM's log follows; Ctrl-C stops it); use it "
        f"with: posbias run --model {model} --base-url {command.base_url}"
        + (f" --endpoint-model {command.served_model}" if served_model_name else ""),
        markup=False,
        soft_wrap=True,
    )
    _run(command.argv, env={**os.environ, **command.env})


def _run(argv: list[str], *, env: dict[str, str]) -> None:
    """Run the server in the foreground; SIGTERM and Ctrl-C reach it, and its exit code is this command's."""
    process = subprocess.Popen(argv, env=env)
    previous: Any = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: process.send_signal(signal.SIGTERM))
    try:
        code = process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        code = process.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if code not in (0, -signal.SIGINT, -signal.SIGTERM):
        raise typer.Exit(code if code > 0 else 1)
