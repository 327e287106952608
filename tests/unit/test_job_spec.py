"""The job spec as a user writes it: YAML or JSON, flags over the file, and errors that name the fix."""

from __future__ import annotations

import json
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
