"""Prompts counted from their pieces (`workers/prompt_tokens.py`) against the same prompts rendered and
tokenized whole, the reference: the same length and the same question ends for every trial of every design,
filler place, answer order, option shuffle and chat template use, with the fake engine's tokenizer and
tiny byte-level BPE tokenizers; and the dry run that counts so shows what tokenizing every prompt whole shows.
The demo model's tokenizer and a tiny model folder's: tests/integration/test_prompt_counts.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from support.odd_tokenizers import ChunkTokenizer

from posbias.schemas import JobSpec, QuestionPool
from posbias.service.settings import Settings
from posbias.service.work import planner, submission
from posbias.workers.engine import Encoding, Tokenizer
from posbias.workers.fake_engine import FakeTokenizer
from posbias.workers.filler import filler_text
from posbias.workers.prompt_tokens import PromptCounter
from posbias.workers.tiny_models import _GEMMA_STYLE, _LLAMA_STYLE, _build_tokenizer
from posbias.workers.tokenizer import HfTokenizer

USER_FILLER = (
    "A line with no sentence end\nAnother line, its words   spaced oddly\n"
    "\u00e9t\u00e9 \u2014 caf\u00e9 12345\n"
)

# design, filler place, answer order (a probe asks one answer: forward), shuffled options, chat template.
CASES = [
    ("random", "end", "forward", False, "auto"),
    ("random", "before", "reverse", True, "off"),
    ("random", "after", "random", True, "auto"),
    ("rotation", "end", "random", False, "off"),
    ("rotation", "before", "forward", True, "auto"),
    ("rotation", "after", "reverse", False, "off"),
    ("probe", "end", "forward", True, "off"),
    ("probe", "before", "forward", False, "auto"),
    ("probe", "after", "forward", False, "auto"),
]


def _spec(case: tuple[str, str, str, bool, str], *, tokens: list[int], **fields: Any) -> JobSpec:
    design, where, order, shuffle, chat = case
    filler: dict[str, Any] = {"tokens": tokens, "where": where}
    if where == "after":
        filler["position"] = 2
    return JobSpec.model_validate(
        {
            "model": "m",
            "engine": {"name": "fake"},
            "batch_sizes": [3, 4],
            "iterations": 2,
            "design": design,
            "answer_order": order,
            "shuffle_choices": shuffle,
            "chat_template": chat,
            "filler": filler,
            **fields,
        }
    )


def _assert_counts_equal(spec: JobSpec, pool: QuestionPool, tokenizer: Tokenizer) -> PromptCounter:
    planned = planner.plan(spec, pool=pool)
    counter = PromptCounter.for_spec(spec, questions=planned.questions, tokenizer=tokenizer)
    for trial in planned.trials:
        assert counter.count(trial) == counter.whole(trial), (trial.index, trial.filler_tokens)
    return counter


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, case)) for case in CASES])
def test_pieces_count_what_the_whole_prompt_counts_with_the_fake_tokenizer(
    case: tuple[str, str, str, bool, str], mmlu_pool: QuestionPool
) -> None:
    # Lengths that leave no filler middle (1, 2, 7: shorter than the tokenizer's reach on both sides) and
    # ones that do, several per sampled set, so the text around the filler is reused from one to the next.
    spec = _spec(case, tokens=[0, 1, 2, 7, 40, 333, 2000])
    counter = _assert_counts_equal(spec, mmlu_pool, FakeTokenizer())
    assert counter.exact


def test_pieces_count_a_users_filler_text_and_separator_as_the_whole_prompt(mmlu_pool: QuestionPool) -> None:
    """A filler file without sentence ends (cut by lines), with non-ASCII text and digits, between
    paragraphs that a custom separator joins (one newline: a whitespace run merging with the filler's)."""
    for separator in ("\n", " | "):
        spec = _spec(CASES[2], tokens=[0, 3, 50, 900], prompt={"separator": separator})
        assert spec.filler is not None
        filler = spec.filler.model_copy(update={"source": "filler.txt", "text": USER_FILLER})
        spec = spec.model_copy(update={"filler": filler})
        _assert_counts_equal(spec, mmlu_pool, FakeTokenizer(chat_template=False))


@pytest.mark.parametrize("style", ["llama", "gemma"])
@pytest.mark.parametrize("case", CASES[::2], ids=["-".join(map(str, case)) for case in CASES[::2]])
def test_pieces_count_what_the_whole_prompt_counts_with_a_byte_level_bpe_tokenizer(
    case: tuple[str, str, str, bool, str], style: str, mmlu_pool: QuestionPool
) -> None:
    """Tiny trained BPE tokenizers as the tiny models carry (digits split, GPT-2's byte-level pre-tokenizer,
    each model's chat template): a filler of 1,500 tokens is several times their default reach."""
    tokenizer = HfTokenizer(
        _build_tokenizer(_LLAMA_STYLE if style == "llama" else _GEMMA_STYLE, vocab_size=512, seed=0)
    )
    counter = _assert_counts_equal(_spec(case, tokens=[0, 1, 9, 120, 1500]), mmlu_pool, tokenizer)
    assert not counter.exact  # a model's tokenizer states no reach


def test_a_fillers_cut_from_one_long_tokenization_is_the_cut_filler_text_makes(
    mmlu_pool: QuestionPool,
) -> None:
    """Every length from 1 to 129, and some long ones, for sets that start at different sentences."""
    spec = _spec(CASES[0], tokens=[*range(1, 130), 200, 333, 1234, 4321])
    trials = [t for t in planner.plan(spec, pool=mmlu_pool).trials if t.batch_size == 3]
    for tokenizer in (FakeTokenizer(), HfTokenizer(_build_tokenizer(_LLAMA_STYLE, vocab_size=512, seed=0))):
        counter = PromptCounter.for_spec(spec, questions={}, tokenizer=tokenizer)
        for trial in trials:
            assert spec.filler is not None
            run, cut = counter._filler_cut(trial, spec.filler)
            made = filler_text(spec.filler, trial, seed=spec.seed, tokenizer=tokenizer, separator="\n\n")
            assert run.text[:cut] == made, (type(tokenizer).__name__, trial.filler_tokens)


class _ClosingTokenizer(FakeTokenizer):
    """Adds EOS after the text (at offset 0, as Hugging Face puts added tokens): prompts are counted whole."""

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        encoding = super().encode(text, add_special_tokens=add_special_tokens)
        if add_special_tokens:
            encoding.ids.append(1)
            encoding.offsets.append((0, 0))
        return encoding


def test_a_tokenizer_that_adds_tokens_after_the_text_is_counted_whole(mmlu_pool: QuestionPool) -> None:
    spec = _spec(CASES[1], tokens=[0, 300])
    counter = _assert_counts_equal(spec, mmlu_pool, _ClosingTokenizer(chat_template=False))
    assert not counter._pieces


_POOLS: dict[str, QuestionPool] = {}
"""MMLU as read once for this module's dry runs (`prepare`'s `pools`)."""


@pytest.fixture
def settings(mmlu_dir: Path, tmp_path: Path) -> Settings:
    return Settings(mmlu_dir=mmlu_dir, cache_dir=tmp_path / "cache")


def _prepare(spec: JobSpec, settings: Settings) -> submission.Prepared:
    return submission.prepare(spec, settings=settings, pools=_POOLS)


def _whole(prepared: submission.Prepared, settings: Settings) -> Any:
    return submission._dry_run(
        prepared, settings=settings, sample=submission.SAMPLE_TRIALS, on_progress=None, whole=True
    )


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, case)) for case in CASES])
@pytest.mark.parametrize(
    "lengths", [[0, 256, 1024], list(range(0, 1500, 50))], ids=["3 lengths", "30 lengths"]
)
def test_a_dry_run_shows_what_tokenizing_every_prompt_whole_shows(
    case: tuple[str, str, str, bool, str], lengths: list[int], settings: Settings
) -> None:
    """Prompt tokens per batch size, and per batch size and filler length the prompt lengths, the token
    distances and the share past the fake's window: a sample of 6 sets per length, or 1 over 30 lengths."""
    spec = _spec(case, tokens=lengths, iterations=8, fake={"window": 700})
    prepared = _prepare(spec, settings)
    fast, whole = submission.dry_run(prepared, settings=settings), _whole(prepared, settings)
    assert fast.batch_sizes == whole.batch_sizes
    assert fast.designs == whole.designs
    assert all(d.past_window is not None for d in fast.designs)
    assert (fast.counting, whole.counting) == (
        "exactly, from each prompt's pieces",
        "each prompt tokenized whole",
    )
    assert fast.model_dump(exclude={"counting"}) == whole.model_dump(exclude={"counting"})


def test_a_dry_run_with_a_models_tokenizer_checks_its_counts_against_whole_prompts(
    settings: Settings,
) -> None:
    spec = _spec(CASES[4], tokens=[0, 40, 1500], fake={"window": 900})
    prepared = _prepare(spec, settings)
    bpe = HfTokenizer(_build_tokenizer(_GEMMA_STYLE, vocab_size=512, seed=0))
    prepared = dataclasses.replace(prepared, tokenizer=bpe, tokenizer_source="the model's tokenizer")
    fast, whole = submission.dry_run(prepared, settings=settings), _whole(prepared, settings)
    assert fast.model_dump(exclude={"counting"}) == whole.model_dump(exclude={"counting"})
    assert fast.counting == (
        "from each prompt's pieces: exact unless the tokenizer shapes a token from text over 256 characters "
        "away; 2 prompts tokenized whole agreed"
    )


def test_a_dry_run_counts_every_prompt_whole_when_its_pieces_count_differently(settings: Settings) -> None:
    spec = _spec(CASES[0], tokens=[0, 500])
    prepared = _prepare(spec, settings)
    prepared = dataclasses.replace(prepared, tokenizer=ChunkTokenizer())
    planned = prepared.plan
    counter = PromptCounter.for_spec(prepared.spec, questions=planned.questions, tokenizer=ChunkTokenizer())
    assert any(counter.count(t) != counter.whole(t) for t in planned.trials)  # the pieces are wrong here
    fast, whole = submission.dry_run(prepared, settings=settings), _whole(prepared, settings)
    assert fast.model_dump(exclude={"counting"}) == whole.model_dump(exclude={"counting"})
    assert (
        fast.counting == "each prompt tokenized whole: counted from its pieces, a prompt came out different"
    )


def test_the_dry_run_command_says_how_it_counted_and_shows_a_long_sweep_in_a_few_rows(
    mmlu_dir: Path, tmp_path: Path
) -> None:
    """100 filler lengths: the table shows 40 of them, evenly spaced from the first to the last, and says
    so; --json keeps every one. Both say the prompts were counted exactly, from their pieces."""
    import json

    from support.in_process import run_cli

    spec = {"model": "m", "engine": {"name": "fake"}, "batch_sizes": [2, 3], "iterations": 1}
    spec["filler"] = {"tokens": list(range(0, 1000, 10))}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {"POSBIAS_MMLU_DIR": str(mmlu_dir), "POSBIAS_CACHE_DIR": str(tmp_path / "cache")}
    shown = run_cli(["submit", "spec.json", "--dry-run"], env=env, folder=tmp_path, drop_prefix="POSBIAS_")
    assert shown.code == 0, shown.stderr
    assert (
        "showing 40 of the 100 filler lengths of each batch size, evenly spaced; --json lists every one"
        in (shown.stdout)
    )
    rows = [line.split("│")[1:3] for line in shown.stdout.splitlines() if line.count("│") == 8]
    lengths = [int(length.strip().replace(",", "")) for size, length in rows if size.strip() == "2"]
    assert len(lengths) == 40 and (lengths[0], lengths[-1]) == (0, 990)
    assert "(counted with the fake engine's tokenizer; exactly, from each prompt's pieces)" in shown.stdout
    listed = run_cli(
        ["submit", "spec.json", "--dry-run", "--json"], env=env, folder=tmp_path, drop_prefix="POSBIAS_"
    )
    assert listed.code == 0, listed.stderr
    dry = json.loads(listed.stdout)
    assert len(dry["designs"]) == 200
    assert dry["counting"] == "exactly, from each prompt's pieces"
