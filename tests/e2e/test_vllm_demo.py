"""The embedded default for real: the demo model (SmolLM2-135M-Instruct) through the CLI, a local Ray and the
vLLM CPU build, into SQLite, as the README's first command does.

The worker is a process of its own, as a user starts it (its own local Ray, vLLM in a Ray actor); the commands
around it run in this process (`cli`), through the same entry point: each as a process would spend 2-10 s on
imports and on loading the model's tokenizer again, 70 s of this test's 150."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from support.testcache import posbias_cache

pytestmark = pytest.mark.vllm


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite only: the embedded default (PostgreSQL is covered by the fake-engine session)."""
    return f"sqlite:///{tmp_path / 'posbias.db'}"


def test_demo_model_end_to_end_through_ray_and_vllm(
    cli: Any, posbias: Any, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A fresh cache, so the GGUF file is converted here; its compiled kernels are the suite's (testcache).
    cache = {"POSBIAS_CACHE_DIR": str(posbias_cache(tmp_path_factory.mktemp("model-cache")))}
    cli("db", "upgrade")
    dry = cli(
        "submit",
        "--model",
        "demo",
        "--batch-sizes",
        "10",
        "--iterations",
        "2",
        "--dry-run",
        "--json",
        **cache,
    ).json()
    assert dry["tokenizer"] == "the model's tokenizer"
    # The engine's context from the plan: the longest prompt plus 224 tokens for the answers, rounded up to a
    # power of two, instead of the model's own 8,192.
    context = dry["max_model_len"]
    assert dry["model_context"] == 8192 and dry["spec"]["engine"]["max_model_len"] == context
    assert context & (context - 1) == 0
    assert dry["batch_sizes"][0]["max_prompt_tokens"] + 224 <= context < 8192
    too_long = cli(
        "submit", "--model", "demo", "--batch-sizes", "80", "--iterations", "1", check=False, **cache
    )
    assert too_long.code == 1 and len(too_long.error_lines) == 1, too_long.stderr
    assert "the longest prompt at batch size 80 is" in too_long.error_lines[0]
    assert "more than the model's context of 8,192 tokens" in too_long.error_lines[0]

    first_flags = (
        "--model",
        "demo",
        "--batch-sizes",
        "1,10",
        "--iterations",
        "2",
        "--answer-mode",
        "constrained",
    )
    first_dry = cli("submit", *first_flags, "--dry-run", "--json", **cache).json()
    first = cli("submit", *first_flags, "--json", **cache).json()
    second = cli(
        "submit",
        "--model",
        "demo",
        "--batch-sizes",
        "10",
        "--iterations",
        "1",
        "--answer-mode",
        "constrained",
        "--seed",
        "1",
        "--max-model-len",  # the first job's, chosen from its plan: the same engine serves both
        str(context),
        "--json",
        **cache,
    ).json()
    # A design that separates the suspects: answers asked in a stated random order, and questions 1-5 moved
    # 48 filler tokens away from their answers (and not), in the same engine.
    designed = cli(
        "submit",
        "--model",
        "demo",
        "--batch-sizes",
        "10",
        "--iterations",
        "1",
        "--answer-mode",
        "constrained",
        "--answer-order",
        "random",
        "--filler-tokens",
        "0,48",
        "--filler-where",
        "after",
        "--filler-after",
        "5",
        "--max-model-len",
        str(context),
        "--json",
        **cache,
    ).json()
    worker = posbias("worker", "--until-empty", "--json", **cache).json()

    assert worker["shards_failed"] == 0 and worker["trials_done"] == 2 + 2 + 1 + 2
    assert list(worker["model_loads"].values()) == [1], "two jobs of one model in a row load it once"
    for job in (first["job_id"], second["job_id"], designed["job_id"]):
        status = cli("status", str(job), "--json", **cache).json()
        assert status["status"] == "done"
        engine = status["engine"]
        assert engine["name"] == "vllm" and engine["dtype"] == "float32"
        assert engine["device"] == "cpu" and engine["attention_backend"] == "CPU_ATTN"
        # What vLLM started with is the context chosen from the plan, as stored in the job's spec.
        assert engine["max_model_len"] == context
        # Reported by the workers for each of the model's 30 layers, not guessed.
        assert engine["attention_layers"] == ["CPU_ATTN"] * 30 and not engine["attention_backend_guessed"]

    curve = cli("curve", "--job", str(first["job_id"]), "--batch-size", "10", "--format", "json").json()[0]
    assert [p["position"] for p in curve["points"]] == list(range(1, 11))
    assert all(p["n"] == 2 and p["parse_rate"] == 1.0 for p in curve["points"]), (
        "constrained: every answer parses"
    )
    assert all(0.0 < p["mean_gold_prob"] <= 1.0 for p in curve["points"])

    cli("export", str(first["job_id"]), "--out", "demo.csv")
    rows = list(csv.DictReader((tmp_path / "demo.csv").read_text().splitlines()))
    assert len(rows) == 2 * 1 + 2 * 10
    # The dry run of the same spec counted each prompt (2 a batch size: all of them) with the model's
    # tokenizer: the lengths vLLM was then given, as stored.
    for estimate in first_dry["batch_sizes"]:
        stored = {
            int(r["trial_index"]): int(r["prompt_tokens"])
            for r in rows
            if int(r["batch_size"]) == estimate["batch_size"]
        }
        assert estimate["trials"] == len(stored) == 2
        assert estimate["mean_prompt_tokens"] == pytest.approx(sum(stored.values()) / 2)
        assert estimate["max_prompt_tokens"] == max(stored.values())
    for row in rows:
        start, end = int(row["question_token_start"]), int(row["question_token_end"])
        assert 0 <= start < end <= int(row["prompt_tokens"])
        assert int(row["token_distance"]) == int(row["prompt_tokens"]) - end + int(row["answer_token_index"])
        assert sum(json.loads(row["option_probs"])) == pytest.approx(1.0, abs=1e-3)

    cli("export", str(designed["job_id"]), "--out", "designed.csv")
    rows = list(csv.DictReader((tmp_path / "designed.csv").read_text().splitlines()))
    assert len(rows) == 2 * 10 and {row["filler_tokens"] for row in rows} == {"0", "48"}
    by_length = {length: [r for r in rows if r["filler_tokens"] == length] for length in ("0", "48")}
    orders = {length: json.loads(group[0]["answer_order"]) for length, group in by_length.items()}
    assert orders["0"] == orders["48"] and sorted(orders["0"]) == list(range(1, 11)), "one order per set"
    distance = {}
    for length, group in by_length.items():
        for row in group:
            # The constrained sheet follows the stated order: position p is on the line where p is asked.
            assert int(row["answer_slot"]) == orders[length].index(int(row["position"])) + 1
            assert row["in_window"] == "" and row["visible_layers"] == "30", "no window: every layer sees it"
            distance[length, int(row["position"])] = int(row["token_distance"])
        if length == "48":
            start, end = int(group[0]["filler_token_start"]), int(group[0]["filler_token_end"])
            assert end - start == 48
    # The filler after question 5 moves questions 1-5, and only them, 48 tokens further from their answers.
    # (48 tokens and the paragraph break that sets it apart).
    moved = [distance["48", p] - distance["0", p] for p in range(1, 11)]
    assert moved[5:] == [0] * 5 and len(set(moved[:5])) == 1 and 48 <= moved[0] <= 52, moved
    slots = cli("curve", "--job", str(designed["job_id"]), "--by", "answer-slot", "--format", "json").json()
    assert sorted(c["filler_tokens"] for c in slots) == [0, 48], "one curve per filler length"
    assert all([p["position"] for p in c["points"]] == list(range(1, 11)) for c in slots)

    (model,) = cli("models", "--json").json()
    assert model["name"] == "demo" and model["architecture"] == "LlamaForCausalLM"
    assert model["num_layers"] == 30 and model["rope_theta"] == 100000.0 and model["sliding_window"] is None
    assert model["num_parameters"] > 100_000_000
