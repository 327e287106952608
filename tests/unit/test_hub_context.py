"""The engine's context for a hub model whose files are not on the submitting machine: its config alone is
fetched from the hub (here through a stand-in for `hf_hub_download`, the one function that reaches the
network), and without it a stated default from the prompts; the dry run and `posbias status` say which."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

import posbias
from posbias.cli import app

HUB_MODEL = "posbias-test/llama-far-away"
COMMIT = "0" * 40
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 131072,
}


class Hub:
    """`hf_hub_download` for a hub that holds only `HUB_MODEL`'s config: files it serves land in the cache
    layout huggingface_hub writes, so transformers reads them back as it would a real download."""

    def __init__(self, cache: Path, *, reachable: bool) -> None:
        self.cache, self.reachable, self.asked = cache, reachable, []

    def __call__(self, repo_id: str, filename: str, **kwargs: Any) -> str:
        self.asked.append(filename)
        if kwargs.get("local_files_only") or not self.reachable:
            raise LocalEntryNotFoundError(f"{filename} of {repo_id} is not in the cache and the hub is away")
        if repo_id != HUB_MODEL or filename != "config.json":
            raise LocalEntryNotFoundError(f"this hub serves no {filename} for {repo_id}")
        repo = self.cache / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(COMMIT)
        snapshot = repo / "snapshots" / COMMIT
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / filename).write_text(json.dumps(CONFIG))
        return str(snapshot / filename)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mmlu_dir: Path) -> Any:
    import huggingface_hub.constants
    import transformers.utils.hub

    def make(*, reachable: bool) -> Hub:
        cache = tmp_path / "hf"
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
        monkeypatch.setattr(transformers.utils.hub.constants, "HF_HUB_CACHE", str(cache))
        stand_in = Hub(cache, reachable=reachable)
        monkeypatch.setattr(transformers.utils.hub, "hf_hub_download", stand_in)
        # The TCP probe before a fetch sees the stand-in's hub, not this machine's network.
        monkeypatch.setattr("posbias.workers.hub.reachable", lambda endpoint: reachable)
        monkeypatch.setenv("POSBIAS_MMLU_DIR", str(mmlu_dir))
        monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("POSBIAS_DATABASE_URL", f"sqlite:///{tmp_path / 'posbias.db'}")
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
        return stand_in

    return make


SUBMIT = ["submit", "--model", HUB_MODEL, "--batch-sizes", "10", "--iterations", "2"]


@pytest.mark.timeout(120)
def test_a_hub_model_not_here_gets_its_context_from_the_fetched_config(
    hub: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    served = hub(reachable=True)
    assert app.run([*SUBMIT, "--dry-run"]) == 0
    said = capsys.readouterr().out
    (line,) = [text for text in said.splitlines() if text.startswith("engine context:")]
    assert "the model's config fetched from the hub" in line and "the model's own: 131,072" in line
    assert "estimated at 2 characters a token" in line  # no tokenizer here: the prompts are estimated
    tokens = int(line.split()[2].replace(",", ""))
    assert 1024 <= tokens < 131072 and tokens & (tokens - 1) == 0
    assert "config.json" in served.asked and not any(name.endswith(".safetensors") for name in served.asked)

    # Submitted for real (from a machine that has not fetched the config yet), the stored job holds the
    # context and its source, and `posbias status` says it.
    shutil.rmtree(served.cache)
    assert app.run(["db", "upgrade"]) == 0
    capsys.readouterr()
    assert app.run([*SUBMIT, "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["job_id"]
    assert app.run(["status", str(job_id), "--json"]) == 0
    stored = json.loads(capsys.readouterr().out)
    assert posbias.job(job_id).spec.engine.max_model_len == tokens
    assert stored["context"]["tokens"] == tokens
    assert "fetched from the hub" in stored["context"]["source"]
    assert app.run(["status", str(job_id)]) == 0
    assert f"engine context: {tokens:,} (the longest prompt" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_without_the_hub_the_context_is_a_stated_default(
    hub: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    hub(reachable=False)
    assert app.run([*SUBMIT, "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["model_context"] is None
    assert dry["context"]["tokens"] == dry["spec"]["engine"]["max_model_len"] is not None
    assert dry["context"]["source"].endswith("a default, no tokenizer or config could be had")
    longest = max(b["max_prompt_tokens"] for b in dry["batch_sizes"])
    assert longest < dry["context"]["tokens"]
