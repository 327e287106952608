"""`posbias trial` on the real vLLM CPU build: a demo-model job's trials, shown from the store, are token for
token the prompts vLLM itself reports having processed (`RequestOutput.prompt_token_ids`), rebuilt with the
tokenizer the view loads from the model's files (the GGUF file's conversion), chat template included: read
without transformers (`LightTokenizer`), and with transformers' own where the light one's prompt does not
pass the check against what the worker stored."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from posbias.schemas import Submitted
from posbias.service.reports.trial_view import prompt_tokenizer, trial_detail
from posbias.service.store import database
from posbias.service.store.tables import Job, Trial
from posbias.service.work import load_spec, queue
from posbias.workers.light_tokenizer import LightTokenizer, light_tokenizer
from posbias.workers.models import local_tokenizer, tokenizer_folder
from posbias.workers.shard import run_shards
from posbias.workers.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm


def test_a_demo_trials_prompt_is_what_vllm_processed(
    sqlite_url: str,
    make_job: Callable[..., Submitted],
    demo_engine: VllmEngine,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    llm: Any = demo_engine._llm
    generate = llm.generate
    processed: list[list[int]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        outputs = generate(*args, **kwargs)
        processed.extend([int(t) for t in output.prompt_token_ids] for output in outputs)
        return outputs

    monkeypatch.setattr(llm, "generate", recording)
    with database.connect(sqlite_url) as db:
        job_id = make_job(
            db,
            model="demo",
            engine={"name": "vllm"},
            answer_mode="constrained",
            batch_sizes=(3,),
            iterations=2,
            answer_order="reverse",
        ).job_id
        leases = queue.lease(db, owner="vllm-test", limit=10, lease_seconds=600, job_ids=[job_id])
        outcomes = queue.complete(
            db, run_shards([lease.shard for lease in leases], engine=demo_engine), owner="vllm-test"
        )
        assert leases and all(outcome.written for outcome in outcomes)
        with db.read() as session:
            ids = list(session.scalars(select(Trial.id).where(Trial.job_id == job_id).order_by(Trial.index)))
            views = [trial_detail(session, job_id, trial_id, cache_dir=cache_dir) for trial_id in ids]
            spec = load_spec(session.get(Job, job_id).spec)
            # The view's tokenizer reads the files as transformers does, and did not need transformers' own.
            light = prompt_tokenizer(spec, cache_dir=cache_dir)
            assert isinstance(light, LightTokenizer)
            assert [trial_detail(session, job_id, i, tokenizer=light).prompt_token_ids for i in ids] == [
                v.prompt_token_ids for v in views
            ]
            # Where the light reading differs from transformers' (here its copy of the files has another chat
            # template), the check against the stored token figures fails and transformers' own rebuilds it.
            folder = tokenizer_folder("demo", cache_dir=cache_dir)
            assert folder is not None
            other = shutil.copytree(
                folder, tmp_path / "other-reading", ignore=shutil.ignore_patterns("*.safetensors")
            )
            template = other / "chat_template.jinja"
            template.write_text("{{ bos_token }}Reply in French.\n" + template.read_text())
            misread = light_tokenizer(other, full=lambda: local_tokenizer("demo", cache_dir=cache_dir))
            assert misread is not None and misread.apply_chat_template("x") != light.apply_chat_template("x")
            fallen_back = [trial_detail(session, job_id, i, tokenizer=misread) for i in ids]

    assert len(processed) == len(views) == 2
    assert [v.prompt_token_ids for v in views] == processed
    assert [v.prompt_token_ids for v in fallen_back] == processed
    assert all(v.check.matches for v in fallen_back)
    for view in views:
        assert view.chat_template_used and view.prompt_text.startswith("<|im_start|>")
        assert view.check.matches is True and view.check.compared == 1 + 2 * 3
        assert view.output_text and [a.position for a in view.answers] == [1, 2, 3]
        assert all(a.parsed and a.option_probs is not None for a in view.answers)


PROBE = """
import json, sys
from posbias.cli.app import run
code = run(sys.argv[2:])
with open(sys.argv[1], "w") as found:
    json.dump({"code": code, "modules": sorted(sys.modules)}, found)
"""


def test_posbias_trial_on_a_demo_job_loads_neither_transformers_nor_torch(
    sqlite_url: str,
    make_job: Callable[..., Submitted],
    demo_engine: VllmEngine,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    # Importing transformers imports torch: seconds of a command that shows one trial (issue 39's `trial`).
    with database.connect(sqlite_url) as db:
        job_id = make_job(db, model="demo", engine={"name": "vllm"}, batch_sizes=(2,), iterations=1).job_id
        leases = queue.lease(db, owner="vllm-test", limit=10, lease_seconds=600, job_ids=[job_id])
        queue.complete(
            db, run_shards([lease.shard for lease in leases], engine=demo_engine), owner="vllm-test"
        )
        with db.read() as session:
            trial_id = session.scalar(select(Trial.id).where(Trial.job_id == job_id))
    report = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(report), "trial", str(job_id), str(trial_id), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={
            "PATH": "/usr/bin:/bin",
            "POSBIAS_DATABASE_URL": sqlite_url,
            "POSBIAS_CACHE_DIR": str(cache_dir),
        },
    )
    found = json.loads(report.read_text())
    assert found["code"] == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["check"]["matches"] is True and view["prompt_token_ids"][:1] == [1]  # <|im_start|>
    heavy = [m for m in found["modules"] if m.split(".")[0] in ("transformers", "torch", "numpy")]
    assert heavy == [], f"posbias trial imported {heavy[:8]}"
