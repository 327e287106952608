"""Filler: neutral text of a controlled length in the model's own tokens, to move questions away from their
answers (or from the prompt's start) without changing their positions.

The built-in source is plain, repetitive, content-free sentences written for posbias, in the spirit of the
passkey-retrieval studies' "the grass is green" haystack: nothing in it bears on any MMLU question, and
nothing in it looks like a question, an option or an answer line. A user's text file serves the same way
(`FillerSpec.source`). Each prompt's filler starts at a sentence drawn from the job's seed and its sampled
set (so every length of one set shows the same text, the longer ones continuing it) and runs on through the
source, wrapping around, until it is exactly the asked number of tokens: cut at a token boundary, measured
with the model's tokenizer between the prompt's separators, as it will sit in the prompt. Without a
tokenizer (a submit-time estimate) it is 4 characters a token.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from posbias.schemas import FillerSpec, PosbiasError, Trial
from posbias.schemas.files import read_text
from posbias.schemas.filler_spec import MAX_FILLER_FILE_BYTES
from posbias.workers.engine import Tokenizer
from posbias.workers.tokenizer import CHARS_PER_TOKEN

BUILTIN_TEXT = (
    "The day is calm. The road goes on and on. The hours pass one by one. The wind is soft and the air is "
    "still. The light stays even through the afternoon. Nothing much happens here. The path is wide and "
    "flat. A door opens and closes again. The clock keeps its pace. The fields lie quiet under a pale sky. "
    "Someone walks along the edge of the lake and back. The water is level and grey. A page is turned, "
    "then another. The room is warm and the lamp is on. The street is empty for a while. Time moves "
    "slowly, and then it moves a little faster. The river runs under the bridge. The trees stand in a "
    "long row. The morning turns into noon and the noon into evening. The same sounds come and go. A cup "
    "of tea cools on the table. The window looks out on the same wall. The wall is white and plain. The "
    "train passes at the usual time. The grass grows where it always grows. The hill is low and round. "
    "Clouds drift from one side of the sky to the other. It is an ordinary day, much like the one before."
)
"""The built-in filler: about 260 words in 27 sentences, repeated as often as a length needs."""
_FILLER_STREAM = 7
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CACHE_SIZE = 4096


@lru_cache(maxsize=16)
def units(text: str) -> tuple[str, ...]:
    """The sentences of `text` (or its lines, or words, when it has no sentence ends), in order."""
    stripped = " ".join(text.split())
    found = [part for part in _SENTENCE_END.split(stripped) if part]
    if len(found) < 2:
        found = [line for line in (line.strip() for line in text.splitlines()) if line]
    if len(found) < 2:
        found = stripped.split()
    if not found:
        raise PosbiasError("the filler source has no text; give a file with some sentences in it")
    return tuple(found)


def read_source(path: str | Path) -> str:
    """The text of the filler file at `path`, read at submit to be stored with the job: a regular UTF-8 file
    of at most `MAX_FILLER_FILE_BYTES` with some words in it. Raises `PosbiasError` naming the fix."""
    file = Path(path).expanduser()
    text = read_text(
        file,
        what="the filler file",
        fix="give a text file, or filler source builtin",
        limit=MAX_FILLER_FILE_BYTES,
        noun="a filler file (stored with the job)",
    )
    if len(text.split()) < 2:
        raise PosbiasError(f"the filler file {file} has no text to cut filler from; give one with sentences")
    return text


def source_text(filler: FillerSpec) -> str:
    """The text filler is cut from: the built-in one, or the user's file as read at submit."""
    if filler.builtin:
        return BUILTIN_TEXT
    if filler.text is None:
        raise PosbiasError(
            f"filler source {filler.source} was not read: submit the job through posbias (it stores the "
            "file's text with the job)"
        )
    return filler.text


def start_for(trial: Trial, *, seed: int, count: int) -> int:
    """The sentence a trial's filler starts at, of `count`: drawn from the job's seed and the trial's batch
    size and iteration, so every filler length (and rotation) of one sampled set starts at the same one."""
    import numpy as np  # here, not above: `posbias trial` renders prompts and needs numpy only for filler

    rng = np.random.default_rng([abs(seed), int(seed < 0), trial.batch_size, trial.iteration, _FILLER_STREAM])
    return int(rng.integers(count))


def filler_text(
    filler: FillerSpec, trial: Trial, *, seed: int, tokenizer: Tokenizer | None, separator: str
) -> str:
    """The filler of `trial` (`trial.filler_tokens` tokens), as it goes between two `separator`s."""
    tokens = trial.filler_tokens
    if tokens == 0:
        return ""
    sentences = units(source_text(filler))
    start = start_for(trial, seed=seed, count=len(sentences))
    if tokenizer is None:
        return _by_characters(sentences, start=start, chars=tokens * CHARS_PER_TOKEN)
    cache = _CUTS.setdefault(tokenizer, {})
    key = (sentences, start, tokens, separator)
    found = cache.get(key)
    if found is None:
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        found = cache[key] = _by_tokens(
            sentences, start=start, tokens=tokens, tokenizer=tokenizer, sep=separator
        )
    return found


# Filler already cut, per tokenizer: the lengths of a sweep recur for every sampled set, and a set's start
# sentence is one of a few dozen, so most cuts repeat.
_CUTS: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[object, ...], str]] = weakref.WeakKeyDictionary()


def running_text(sentences: Sequence[str], *, start: int, chars: int) -> str:
    """Sentences from `start` on, wrapping around, joined by spaces, until at least `chars` long."""
    parts: list[str] = []
    length = 0
    index = start
    while length < chars:
        sentence = sentences[index % len(sentences)]
        parts.append(sentence)
        length += len(sentence) + 1
        index += 1
    return " ".join(parts)


def _by_characters(sentences: Sequence[str], *, start: int, chars: int) -> str:
    text = running_text(sentences, start=start, chars=chars + 1)
    cut = text.rfind(" ", 0, chars + 1)
    return text[: cut if cut > 0 else chars]


def _count(text: str, *, tokenizer: Tokenizer, sep: str) -> list[tuple[int, int]]:
    """The tokens of `text` between two separators, as (start, end) offsets into `text`."""
    encoding = tokenizer.encode(sep + text + sep, add_special_tokens=False)
    lo, hi = len(sep), len(sep) + len(text)
    return [(s - lo, e - lo) for s, e in encoding.offsets if e > lo and s < hi]


def _by_tokens(sentences: Sequence[str], *, start: int, tokens: int, tokenizer: Tokenizer, sep: str) -> str:
    text = ""

    def running(chars: int) -> int:
        nonlocal text
        text = running_text(sentences, start=start, chars=chars)
        return len(text)

    def starts(length: int) -> list[int]:
        return [s for s, _ in _count(text[:length], tokenizer=tokenizer, sep=sep)]

    cut = cut_at(tokens, running=running, starts=starts)  # makes `text`: cut first, then slice
    return text[:cut]


def cut_at(tokens: int, *, running: Callable[[int], int], starts: Callable[[int], Sequence[int]]) -> int:
    """Where filler of `tokens` (at least 1) tokens ends in its running text: how many of its characters
    `filler_text` keeps. `running(chars)` makes the running text at least `chars` long (whole sentences) and
    returns its length; `starts(length)` gives, for the first `length` characters of the last text made, the
    start of each of their tokens as they sit between two separators (offsets into the text, in order),
    counting only tokens that overlap the text. `filler_text` tokenizes those characters;
    `workers/prompt_tokens.py` reads them from one tokenization of a long running text, so that a sweep of
    many lengths costs about one.
    """
    chars = tokens * CHARS_PER_TOKEN
    while True:
        length = running(chars)
        spans = starts(length)
        if len(spans) > tokens:
            break
        chars *= 2
    # Cut at the start of token `tokens`; merges at the cut can move the count by a token, so adjust.
    best = int(spans[tokens])
    for _ in range(4):
        within = starts(best)
        if len(within) == tokens:
            return best
        if len(within) > tokens:
            best = int(within[tokens])
        else:
            longer = [s for s in spans if s > best]
            if not longer:
                break
            best = int(longer[0])
    return best
