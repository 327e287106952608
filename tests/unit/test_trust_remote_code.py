"""A model folder's own Python never runs at submit: every load passes `trust_remote_code=False` unless the
job spec says `engine.trust_remote_code: true`, and then only on the workers."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from posbias.cli import app
from posbias.schemas import JobSpec, PosbiasError
from posbias.workers.models import context_limit, local_model_info
from posbias.workers.variants import read_config

_HOSTILE = """from pathlib import Path
Path(__file__).with_name("RAN").write_text("the folder's code ran")
from transformers import PretrainedConfig
class EvilConfig(PretrainedConfig):
    model_type = {model_type!r}
"""


def _folder_with_code(root: Path, *, model_type: str) -> Path:
    """A model folder whose config maps its classes to a module that, if imported, writes `RAN`."""
    folder = root / f"model-{model_type}"
    folder.mkdir()
    config = {
        "model_type": model_type,
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"},
        "max_position_embeddings": 128,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_evil.py").write_text(_HOSTILE.format(model_type=model_type))
    return folder


def _submit(args: list[str], *, monkeypatch: pytest.MonkeyPatch, mmlu_dir: Path, cache: Path) -> int:
    monkeypatch.setenv("POSBIAS_MMLU_DIR", str(mmlu_dir))
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(cache))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # a prompt would read EOF here and fail the run
    return app.run(["submit", *args, "--dry-run", "--batch-sizes", "1", "--iterations", "2"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model_type", ["posbias-evil", "llama"])
def test_submit_runs_no_code_from_a_model_folder(
    model_type: str,
    tmp_path: Path,
    mmlu_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = _folder_with_code(tmp_path, model_type=model_type)
    code = _submit(["--model", str(folder)], monkeypatch=monkeypatch, mmlu_dir=mmlu_dir, cache=tmp_path)
    said = capsys.readouterr()
    assert not (folder / "RAN").exists()
    assert "[y/N]" not in said.out + said.err
    assert code == 0, said.err
    assert "the model's own code: never run" in said.out


@pytest.mark.timeout(120)
def test_a_trusting_spec_still_runs_no_code_at_submit(
    tmp_path: Path, mmlu_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder_with_code(tmp_path, model_type="posbias-evil")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"model: {folder}\nengine: {{trust_remote_code: true}}\n")
    code = _submit([str(spec)], monkeypatch=monkeypatch, mmlu_dir=mmlu_dir, cache=tmp_path)
    said = capsys.readouterr()
    assert not (folder / "RAN").exists()
    assert code == 0, said.err
    assert "the model's own code: runs on the workers (engine.trust_remote_code: true)" in said.out


def test_config_reads_load_the_builtin_class_or_refuse(tmp_path: Path) -> None:
    known = _folder_with_code(tmp_path, model_type="llama")
    assert context_limit(str(known), cache_dir=tmp_path) == 128
    info = local_model_info(str(known), cache_dir=tmp_path)
    assert info is not None and info.context_length == 128
    assert type(read_config(str(known), cache_dir=tmp_path)).__name__ == "LlamaConfig"
    unknown = _folder_with_code(tmp_path, model_type="posbias-evil")
    assert context_limit(str(unknown), cache_dir=tmp_path) is None
    with pytest.raises(PosbiasError, match="cannot read the config") as refused:
        read_config(str(unknown), cache_dir=tmp_path)
    assert "\n" not in str(refused.value)
    assert not (known / "RAN").exists() and not (unknown / "RAN").exists()


def test_trust_remote_code_is_a_field_not_an_extra() -> None:
    assert JobSpec.build({"model": "m"}).engine.trust_remote_code is False
    assert JobSpec.build({"model": "m", "engine": {"trust_remote_code": True}}).engine.trust_remote_code
    with pytest.raises(PosbiasError, match=r"engine\.trust_remote_code: true") as refused:
        JobSpec.build({"model": "m", "engine": {"extra": {"trust_remote_code": True}}})
    assert "runs the model's own code on the workers" in str(refused.value)


def test_the_field_keeps_the_hash_of_specs_that_do_not_set_it() -> None:
    # Digests of these specs before the field existed: stored jobs keep their idempotency keys and actors.
    before = {
        "9d1e46eb8d348630": ({"model": "m"}, "88769c276753cac2"),
        "8bdc02911e35353d": ({"model": "m", "engine": {"name": "fake"}}, "70ecf7b1de3f9257"),
    }
    for spec_hash, (data, model_key) in before.items():
        spec = JobSpec.build(data)
        assert (spec.spec_hash(), spec.model_key()) == (spec_hash, model_key)
        same = JobSpec.build({**data, "engine": {**data.get("engine", {}), "trust_remote_code": False}})
        assert same.spec_hash() == spec_hash
    trusting = JobSpec.build({"model": "m", "engine": {"trust_remote_code": True}})
    assert trusting.spec_hash() != "9d1e46eb8d348630"
    assert trusting.model_key() != "88769c276753cac2"
