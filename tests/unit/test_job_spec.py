"""The job spec as a user writes it: YAML or JSON, flags over the file, and errors that name the fix."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from posbias.schemas import AnswerMode, EngineName, JobSpec, PosbiasError


def test_yaml_and_json_give_the_same_spec_and_hash(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(
        "model: google/gemma-2-2b-it\nbatch_sizes: [50, 1, 10]\niterations: 7\n"
        "dataset:\n  subjects: anatomy,virology\nengine: {tensor_parallel_size: 2}\n"
    )
    data = {
        "model": "google/gemma-2-2b-it",
        "batch_sizes": [1, 10, 50],
        "iterations": 7,
        "dataset": {"subjects": ["anatomy", "virology"]},
        "engine": {"tensor_parallel_size": 2},
    }
    (tmp_path / "job.json").write_text(json.dumps(data))
    from_yaml = JobSpec.from_file(tmp_path / "job.yaml")
    from_json = JobSpec.from_file(tmp_path / "job.json")
    assert from_yaml == from_json
    assert from_yaml.batch_sizes == (1, 10, 50)
    assert from_yaml.dataset.subjects == ("anatomy", "virology")
    assert from_yaml.spec_hash() == from_json.spec_hash()


def test_flags_override_the_file_field_by_field(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(
        "model: m\niterations: 7\nengine: {tensor_parallel_size: 2, dtype: bfloat16}\n"
    )
    spec = JobSpec.from_file(
        tmp_path / "job.yaml", iterations=3, answer_mode="constrained", engine={"tensor_parallel_size": 4}
    )
    assert spec.iterations == 3 and spec.answer_mode is AnswerMode.constrained
    assert spec.engine.tensor_parallel_size == 4
    assert spec.engine.dtype == "bfloat16", "an override of one engine field keeps the file's others"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": "m", "batch_sizes": "0"}, "batch_sizes: batch sizes must be between 1 and 200 (got [0])"),
        ({"model": "m", "batch_sizes": "1,x"}, "comma-separated integers"),
        ({"model": "m", "batch_sizes": []}, "give at least one batch size"),
        ({"model": "m", "batchsize": 5}, "batchsize: unknown field"),
        ({"model": "m", "engine": {"tensor_parallel_size": 0}}, "engine.tensor_parallel_size"),
        ({"batch_sizes": "1"}, "model: Field required"),
    ],
)
def test_invalid_specs_are_one_line_naming_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(PosbiasError) as raised:
        JobSpec.build(data)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_unreadable_and_malformed_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(PosbiasError, match="cannot read spec file"):
        JobSpec.from_file(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(PosbiasError, match="not valid YAML/JSON"):
        JobSpec.from_file(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- model\n")
    with pytest.raises(PosbiasError, match="must hold a mapping"):
        JobSpec.from_file(tmp_path / "list.yaml")


def test_max_tokens_follow_the_batch_size_unless_set() -> None:
    spec = JobSpec.build({"model": "m"})
    assert spec.sampling.max_tokens_for(50, answer_mode=AnswerMode.constrained) >= 50 * 5
    assert spec.sampling.max_tokens_for(50, answer_mode=AnswerMode.free) > spec.sampling.max_tokens_for(
        50, answer_mode=AnswerMode.constrained
    )
    fixed = JobSpec.build({"model": "m", "sampling": {"max_tokens": 99}})
    assert fixed.sampling.max_tokens_for(50, answer_mode=AnswerMode.free) == 99


def test_model_key_names_the_loaded_engine() -> None:
    base = JobSpec.build({"model": "m", "iterations": 5})
    assert base.model_key() == JobSpec.build({"model": "m", "iterations": 50, "seed": 3}).model_key()
    assert base.model_key() != JobSpec.build({"model": "m", "engine": {"dtype": "float16"}}).model_key()
    fake = {"model": "m", "engine": {"name": EngineName.fake}}
    worse = {**fake, "fake": {"last": 0.3}}
    assert JobSpec.build(fake).model_key() != JobSpec.build(worse).model_key()


# --- what both stores can hold, and files that are not specs ----------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": ""}, "model: String should have at least 1 character"),
        ({"model": "   "}, "model: name a model"),
        ({"model": "m" * 501}, "model: String should have at most 500 characters"),
        ({"model": "a\x00b"}, "model: text holds a NUL character"),
        ({"model": "m", "prompt": {"separator": "\x00"}}, "prompt.separator: text holds a NUL character"),
        ({"model": "m", "priority": 2**31}, "priority: Input should be less than or equal to 2147483647"),
        ({"model": "m", "seed": 2**64}, "seed: Input should be less than or equal to 9223372036854775807"),
        ({"model": "m", "iterations": True}, "iterations: expected an integer, not true/false"),
        ({"model": "m", "batch_sizes": True}, "batch_sizes: batch sizes must be integers"),
        ({"model": "m", "batch_sizes": "1,\u00b3"}, "comma-separated integers"),
        ({"model": "m", "engine": {"dtype": "garbage"}}, "engine.dtype: dtype must be one of auto, float32"),
        (
            {"model": "m", "sampling": {"temperature": float("inf")}},
            "sampling.temperature: Input should be a finite number",
        ),
        ({"model": "m", "fake": {"delay_s": float("nan")}}, "fake.delay_s: Input should be a finite number"),
        (
            {"model": "m", "engine": {"max_model_len": 2**31}},
            "engine.max_model_len: Input should be less than",
        ),
        ({"model": "m", "revision": "r" * 201}, "revision: String should have at most 200 characters"),
    ],
)
def test_values_a_store_cannot_hold_are_refused_on_both(data: dict[str, object], message: str) -> None:
    with pytest.raises(PosbiasError) as raised:
        JobSpec.build(data)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_yaml_reads_by_the_rules_of_yaml_1_2(tmp_path: Path) -> None:
    # YAML 1.1 (PyYAML's default) reads `1:30` as 90 and `010` as 8; every modern parser as text and 10.
    (tmp_path / "job.yaml").write_text("model: m\niterations: 1:30\n")
    with pytest.raises(PosbiasError, match="iterations: Input should be a valid integer"):
        JobSpec.from_file(tmp_path / "job.yaml")
    (tmp_path / "job.yaml").write_text("model: m\niterations: 010\nshuffle_choices: true\nseed: 0x10\n")
    spec = JobSpec.from_file(tmp_path / "job.yaml")
    assert (spec.iterations, spec.shuffle_choices, spec.seed) == (10, True, 16)


def test_spec_files_are_read_only_when_regular_small_shallow_and_utf8(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.yaml")  # opening it must not wait for a writer
    cases = {
        tmp_path / "fifo.yaml": "is not a regular file",
        Path("/dev/zero"): "is not a regular file",
        tmp_path: "is a folder",
    }
    (tmp_path / "big.yaml").write_bytes(b"# padding\n" * 200_000)
    cases[tmp_path / "big.yaml"] = "a spec is at most 1,048,576 bytes"
    (tmp_path / "deep.json").write_text('{"model": ' + "[" * 5000 + "]" * 5000 + "}")
    cases[tmp_path / "deep.json"] = "nests too deeply"
    (tmp_path / "deep.yaml").write_text("model: " + "[" * 30 + "]" * 30 + "\n")
    cases[tmp_path / "deep.yaml"] = "nests more than 16 levels deep"
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
    )
    (tmp_path / "bomb.yaml").write_text(bomb)
    cases[tmp_path / "bomb.yaml"] = "more than 100,000 values"
    (tmp_path / "latin1.yaml").write_bytes("model: caf\u00e9\n".encode("latin-1"))
    cases[tmp_path / "latin1.yaml"] = "is not UTF-8 text (byte 0xe9 at offset 10)"
    for path, message in cases.items():
        with pytest.raises(PosbiasError, match=re.escape(message)) as raised:
            JobSpec.from_file(path)
        assert str(path) in str(raised.value)
