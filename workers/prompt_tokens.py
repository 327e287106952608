"""Counting a prompt's tokens from its pieces: what `render` with a tokenizer finds (the prompt's length and
where each question ends), without tokenizing each prompt whole.

A dry run counts one prompt or more per batch size and filler length. Over 5,000 filler lengths that was
5,000 prompts of up to thousands of filler tokens, each tokenized whole after its filler had been tokenized
two or three times to cut it: a minute for the fake engine. Here each prompt's text is still built as
`render` builds it (the same `compose` and `wrap`, the filler cut by the same `filler.cut_at`), but its
tokens are counted in pieces:

- the running text a filler is cut from (one per start sentence) is tokenized once, as long as the longest
  filler needs; each filler's cut, and the tokens inside it, are read from that;
- the text before the filler and the text after it are tokenized once each and kept, since the prompts of one
  sampled set repeat them at every filler length;
- per prompt, only the characters around the filler's two ends are tokenized (`reach` on either side).

This is exact when whether a token starts at a character depends only on the text within `reach` characters
of it. The fake engine's tokenizer states such a bound (`token_reach`), which its rules prove. A model's
tokenizer states none: the byte-level BPE and SentencePiece tokenizers posbias has met shape a token from the
word around it, far less than `DEFAULT_REACH`, but nothing proves it of every tokenizer, so such counts say
`exact` False and a dry run checks some of them against whole prompts.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from posbias.schemas import ChatTemplateUse, FillerSpec, JobSpec, PromptTemplate, Question, Trial
from posbias.workers.engine import Tokenizer
from posbias.workers.filler import cut_at, running_text, source_text, start_for, units
from posbias.workers.prompts import RenderedPrompt, compose, render, trial_filler, wrap

DEFAULT_REACH = 256
"""Characters on either side of a piece's end tokenized with it, for a tokenizer that states no bound."""
_KEPT = 4096
"""Tokenized pieces kept per counter before the store is emptied."""

Starts = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PromptTokens:
    """A prompt's length in tokens and where its questions end, as `render` finds them."""

    prompt_tokens: int
    """Tokens of the prompt as sent (`RenderedPrompt.prompt_tokens`)."""
    question_ends: tuple[int, ...]
    """`RenderedQuestion.token_end` of each position, in order."""
    asked: tuple[int, ...]
    """The positions the prompt asks for, in the order it asks them."""

    @classmethod
    def of(cls, rendered: RenderedPrompt) -> PromptTokens:
        """The counts of a prompt rendered with a tokenizer."""
        if rendered.token_ids is None:
            raise ValueError("the prompt was rendered without a tokenizer")
        ends = tuple(q.token_end if q.token_end is not None else 0 for q in rendered.questions)
        return cls(prompt_tokens=len(rendered.token_ids), question_ends=ends, asked=rendered.asked)


class _Uncountable(Exception):
    """The tokenizer put a piece's tokens out of order: that prompt is counted whole."""


class PromptCounter:
    """Counts the prompts of one job's trials (its template, chat template use, filler and seed) with
    `tokenizer`, from their pieces (`count`) or whole (`whole`, by `render`: the reference)."""

    def __init__(
        self,
        *,
        questions: Mapping[str, Question],
        template: PromptTemplate,
        chat_template: ChatTemplateUse,
        tokenizer: Tokenizer,
        filler: FillerSpec | None,
        seed: int,
    ) -> None:
        self._questions = questions
        self._template = template
        self._chat_template = chat_template
        self._tokenizer = tokenizer
        self._filler = filler
        self._seed = seed
        stated = getattr(tokenizer, "token_reach", None)
        self.exact = isinstance(stated, int) and stated > 0
        """True when the tokenizer states how far text shapes a token, so counts from pieces are exact."""
        self.reach = stated if isinstance(stated, int) and stated > 0 else DEFAULT_REACH
        """Characters on either side of a piece's end tokenized with it."""
        self._pieces = tokenizer.prompt_bos_id is None and _adds_in_front_only(tokenizer)
        self._windows: dict[tuple[str, bool], Starts] = {}
        self._runs: dict[int, _Running] = {}
        self._cuts: dict[tuple[int, int], int] = {}

    @classmethod
    def for_spec(
        cls, spec: JobSpec, *, questions: Mapping[str, Question], tokenizer: Tokenizer
    ) -> PromptCounter:
        """A counter of `spec`'s prompts, as `render_trial` renders them."""
        return cls(
            questions=questions,
            template=spec.prompt,
            chat_template=spec.chat_template,
            tokenizer=tokenizer,
            filler=spec.filler,
            seed=spec.seed,
        )

    def whole(self, trial: Trial) -> PromptTokens:
        """`trial`'s counts by rendering its prompt and tokenizing it whole."""
        return PromptTokens.of(
            render(
                trial,
                questions=self._questions,
                template=self._template,
                chat_template=self._chat_template,
                tokenizer=self._tokenizer,
                filler=self._filler,
                seed=self._seed,
            )
        )

    def count(self, trial: Trial) -> PromptTokens:
        """`trial`'s counts from its prompt's pieces: equal to `whole(trial)` (see the module's docstring for
        when that is proven, `exact`). A tokenizer that adds tokens after the text, or that render checks
        for a BOS token, has its prompts counted whole."""
        if not self._pieces:
            return self.whole(trial)
        try:
            return self._count(trial)
        except _Uncountable:
            return self.whole(trial)

    def _count(self, trial: Trial) -> PromptTokens:
        padding = ""
        run: _Running | None = None
        held = trial_filler(trial, filler=self._filler)
        if held is not None:
            run, cut = self._filler_cut(trial, held)
            padding = run.text[:cut]
        laid = compose(
            trial, questions=self._questions, template=self._template, filler=self._filler, padding=padding
        )
        wrapped = wrap(laid.user_text, chat_template=self._chat_template, tokenizer=self._tokenizer)
        shift = wrapped.shift
        marks = [shift + end for _, end in laid.spans]
        filler_at = None
        if run is not None and laid.filler_span is not None:
            filler_at = (shift + laid.filler_span[0], shift + laid.filler_span[1], run)
        total, before = self._count_text(
            wrapped.text, specials=not wrapped.chat_template_used, filler=filler_at, marks=marks
        )
        return PromptTokens(prompt_tokens=total, question_ends=tuple(before), asked=laid.asked)

    def _filler_cut(self, trial: Trial, filler: FillerSpec) -> tuple[_Running, int]:
        """The running text of `trial`'s filler and where `filler_text` cuts it."""
        sentences = units(source_text(filler))
        start = start_for(trial, seed=self._seed, count=len(sentences))
        run = self._runs.get(start)
        if run is None:
            run = self._runs[start] = _Running(
                sentences,
                start=start,
                sep=self._template.separator,
                tokenizer=self._tokenizer,
                reach=self.reach,
            )
        key = (start, trial.filler_tokens)
        cut = self._cuts.get(key)
        if cut is None:
            cut = self._cuts[key] = cut_at(trial.filler_tokens, running=run.running, starts=run.starts)
        return run, cut

    def _count_text(
        self,
        text: str,
        *,
        specials: bool,
        filler: tuple[int, int, _Running] | None,
        marks: Sequence[int],
    ) -> tuple[int, list[int]]:
        """Tokens of `text` (with the tokenizer's added tokens when `specials`), and how many start before
        each of `marks` (the index one past the last such token, as `render` locates a question's end).

        The text is cut into segments, and the tokens starting in each are counted on the segment with
        `reach` characters of context on either side; a segment inside the filler, away from its ends, is
        read from its running text's tokens. Segments are cut so that the text before the filler and the
        text after it are each one piece, the same at every filler length."""
        w = self.reach
        n = len(text)
        if filler is None:
            cuts = [0, n]
            middle = None
        else:
            f0, f1, run = filler
            cuts = [0]
            if f0 > 3 * w:
                cuts.append(f0 - w)
            middle = (f0 + w, f1 - w) if f1 - f0 > 4 * w else None
            if middle is not None:
                cuts += list(middle)
            if n - f1 > 3 * w:
                cuts.append(f1 + w)
            cuts.append(n)
        total = 0
        before = [0] * len(marks)
        for lo, hi in itertools.pairwise(cuts):
            if lo >= hi:
                continue
            if middle is not None and filler is not None and (lo, hi) == middle:
                f0, _, run = filler
                inside = run.count(lo - f0, hi - f0)
                total += inside
                for i, mark in enumerate(marks):
                    if mark >= hi:  # no question ends inside the filler
                        before[i] += inside
                continue
            w_lo, w_hi = max(0, lo - w), min(n, hi + w)
            starts = self._window(text[w_lo:w_hi], specials=specials and w_lo == 0)
            first, last = np.searchsorted(starts, [lo - w_lo, hi - w_lo], side="left")
            total += int(last - first)
            for i, mark in enumerate(marks):
                if mark > lo:
                    upto = int(np.searchsorted(starts, min(hi, mark) - w_lo, side="left"))
                    before[i] += upto - int(first)
        return total, before

    def _window(self, text: str, *, specials: bool) -> Starts:
        """Where the tokens of `text` start (added tokens at 0), in order; kept for the next prompt."""
        key = (text, specials)
        found = self._windows.get(key)
        if found is None:
            if len(self._windows) >= _KEPT:
                self._windows.clear()
            encoding = self._tokenizer.encode(text, add_special_tokens=specials)
            found = np.fromiter((s for s, _ in encoding.offsets), dtype=np.int64, count=len(encoding.offsets))
            if found.size > 1 and bool(np.any(np.diff(found) < 0)):
                raise _Uncountable
            self._windows[key] = found
        return found


class _Running:
    """The running text fillers of one start sentence are cut from, tokenized once as it sits after a
    separator; grown (doubled) when a longer filler needs more."""

    def __init__(self, sentences: Sequence[str], *, start: int, sep: str, tokenizer: Tokenizer, reach: int):
        self._sentences = sentences
        self._start = start
        self._sep = sep
        self._tokenizer = tokenizer
        self._reach = reach
        self.text = ""
        self._starts: Starts = np.zeros(0, dtype=np.int64)
        self._first = 0
        """The first token that overlaps the text (one may start in the separator before it)."""
        turn = [len(sentences[(start + i) % len(sentences)]) + 1 for i in range(len(sentences))]
        self._ends = np.cumsum(turn, dtype=np.int64)
        """The running text's length plus one after each sentence of its first turn through the source."""

    def running(self, chars: int) -> int:
        """`filler.cut_at`'s `running`: the running text's length for `chars`, this text made that long."""
        length = self._length(chars)
        if length > len(self.text) or not self.text:
            self._grow(max(chars, 2 * len(self.text)))
        return length

    def _length(self, chars: int) -> int:
        """`len(running_text(sentences, start=start, chars=chars))`: whole sentences, joined by spaces, until
        their lengths plus one each reach `chars`."""
        if chars <= 0:
            return 0
        turn = int(self._ends[-1])
        turns, rest = divmod(chars, turn)
        if rest == 0:
            return turns * turn - 1
        return turns * turn + int(self._ends[np.searchsorted(self._ends, rest, side="left")]) - 1

    def _grow(self, chars: int) -> None:
        self.text = running_text(self._sentences, start=self._start, chars=chars)
        encoding = self._tokenizer.encode(self._sep + self.text, add_special_tokens=False)
        offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2) - len(self._sep)
        starts, ends = offsets[:, 0], offsets[:, 1]
        if starts.size > 1 and (bool(np.any(np.diff(starts) < 0)) or bool(np.any(np.diff(ends) < 0))):
            raise _Uncountable
        self._starts = starts
        self._first = int(np.searchsorted(ends, 0, side="right"))

    def starts(self, length: int) -> Sequence[int]:
        """`filler.cut_at`'s `starts`: the tokens of the text's first `length` characters between two
        separators, read from the long text's tokens except within `reach` characters of its end."""
        w = self._reach
        if length <= 4 * w:
            encoding = self._tokenizer.encode(
                self._sep + self.text[:length] + self._sep, add_special_tokens=False
            )
            lo, hi = len(self._sep), len(self._sep) + length
            return [s - lo for s, e in encoding.offsets if e > lo and s < hi]
        head = self._starts[self._first : int(np.searchsorted(self._starts, length - w, side="left"))]
        window = self.text[length - 2 * w : length] + self._sep
        encoding = self._tokenizer.encode(window, add_special_tokens=False)
        tail = [length - 2 * w + s for s, _ in encoding.offsets if w <= s < 2 * w]
        return _Joined(head, tail)

    def count(self, lo: int, hi: int) -> int:
        """Tokens of the long text starting in [lo, hi): both at least `reach` inside a filler cut from it."""
        first, last = np.searchsorted(self._starts, [lo, hi], side="left")
        return int(last - first)


class _Joined(Sequence[int]):
    """A long run of token starts followed by a few more, without copying the long run."""

    def __init__(self, head: Starts, tail: list[int]) -> None:
        self._head = head
        self._tail = tail

    def __len__(self) -> int:
        return len(self._head) + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return [*self._head.tolist(), *self._tail][index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return int(self._head[index]) if index < len(self._head) else self._tail[index - len(self._head)]

    def __iter__(self) -> Iterator[int]:
        yield from (int(s) for s in self._head)
        yield from self._tail


def _adds_in_front_only(tokenizer: Tokenizer) -> bool:
    """Whether the tokens the tokenizer adds to a text all come before it, at offset 0 (as BOS does): then a
    prompt's pieces can be counted apart."""
    text = "Read the questions."
    bare = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.encode(text, add_special_tokens=True)
    added = len(full.ids) - len(bare.ids)
    return (
        added >= 0 and full.ids[added:] == bare.ids and all(start == 0 for start, _ in full.offsets[:added])
    )
