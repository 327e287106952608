"""Variants: engine configurations of one job's model, and what each layer of it attends over.

A job's variants answer the same trials with the same model under different engine configurations: the
published one (`baseline`) and interventions on its architecture, named (`global-only`, `window:<tokens>`,
`pattern:<local>:<global>`, `rope-base:<value>`, `rope-base:x<factor>`) or given as a raw `hf_overrides`
mapping. A named intervention becomes `hf_overrides` for the model's config at submit
(`workers/variants.py`), and every intervention states what vLLM must build, layer by layer (`expect`): the
worker compares that with the model vLLM actually built and refuses to run a variant that differs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self

from pydantic import Field, JsonValue, field_validator, model_validator

from posbias.schemas.choices import BASELINE as BASELINE
from posbias.schemas.record import Record

MAX_VARIANTS = 16
MAX_OVERRIDE_DEPTH = 6

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OWN_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_NUMBER = r"(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)"
_SYNTAX = (
    "baseline, global-only, window:<tokens>, pattern:<local>:<global>, rope-base:<value>, "
    "rope-base:x<factor>, or a name of your own (lower case, digits, - _ .) with hf_overrides"
)
ROPE_TOLERANCE = 1e-3
"""Relative difference below which two RoPE bases are the same (the base is read back from float32 tables)."""


class InterventionKind(StrEnum):
    """The named interventions."""

    baseline = "baseline"
    global_only = "global-only"
    window = "window"
    pattern = "pattern"
    rope_base = "rope-base"


@dataclass(frozen=True)
class Intervention:
    """A named variant, parsed: what it changes and by how much."""

    kind: InterventionKind
    tokens: int | None = None
    """`window`: the new sliding window of the layers that slide."""
    local: int | None = None
    """`pattern`: sliding layers per group."""
    global_: int | None = None
    """`pattern`: global layers per group (after the sliding ones, as in Gemma 3)."""
    value: float | None = None
    """`rope-base`: the new RoPE base."""
    factor: float | None = None
    """`rope-base:x<factor>`: the RoPE base multiplied by this."""

    @property
    def name(self) -> str:
        """The canonical spelling, e.g. `window:512`, `rope-base:x2`."""
        if self.kind is InterventionKind.window:
            return f"window:{self.tokens}"
        if self.kind is InterventionKind.pattern:
            return f"pattern:{self.local}:{self.global_}"
        if self.kind is InterventionKind.rope_base:
            return (
                f"rope-base:x{_number(self.factor)}"
                if self.factor is not None
                else f"rope-base:{_number(self.value)}"
            )
        return self.kind.value


def parse_intervention(name: str) -> Intervention | None:
    """The named intervention `name` spells, or None when it is a name of the user's own. Raises `ValueError`
    for a misspelt one (`window:abc`, `pattern:5`, `rope-base:0`)."""
    text = name.strip().lower()
    if text in (InterventionKind.baseline, InterventionKind.global_only):
        return Intervention(InterventionKind(text))
    head, _, rest = text.partition(":")
    if head == "window":
        match = re.fullmatch(r"\d+", rest)
        if match is None or int(rest) < 1:
            raise ValueError(f"{name!r}: give the window in tokens, e.g. window:2048")
        return Intervention(InterventionKind.window, tokens=int(rest))
    if head == "pattern":
        match = re.fullmatch(r"(\d+):(\d+)", rest)
        if match is None or int(match[1]) < 1 or int(match[2]) < 1:
            raise ValueError(
                f"{name!r}: give sliding and global layers per group, e.g. pattern:5:1 (five sliding, "
                "one global)"
            )
        return Intervention(InterventionKind.pattern, local=int(match[1]), global_=int(match[2]))
    if head == "rope-base":
        match = re.fullmatch(r"(x?)" + _NUMBER, rest)
        number = float(match[2]) if match is not None else math.nan
        if match is None or not math.isfinite(number) or number <= 0:
            raise ValueError(
                f"{name!r}: give a positive RoPE base or factor, e.g. rope-base:1000000 or rope-base:x2"
            )
        if match[1]:
            return Intervention(InterventionKind.rope_base, factor=number)
        return Intervention(InterventionKind.rope_base, value=number)
    if ":" in text or not _OWN_NAME.match(text):
        raise ValueError(f"{name!r} is not a variant: use {_SYNTAX}")
    return None


class LayerConfig(Record):
    """What each attention layer of a model attends over, in layer order: asked for (a variant's `expect`)
    or read back from the model vLLM built."""

    windows: tuple[int | None, ...] = Field(
        description="Per layer, its sliding window in tokens; None for a global (full-attention) layer."
    )
    rope_theta: tuple[float | None, ...] = Field(
        description="Per layer, the base of its rotary position embedding; None when it has none."
    )

    @model_validator(mode="after")
    def _one_entry_per_layer(self) -> Self:
        if len(self.windows) != len(self.rope_theta):
            raise ValueError("windows and rope_theta need one entry per layer each")
        return self

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """0-based indices of the layers with a window."""
        return tuple(i for i, window in enumerate(self.windows) if window is not None)

    @property
    def sliding_window(self) -> int | None:
        """The window of the sliding layers (the most common, if they differ); None when none slides."""
        windows = [w for w in self.windows if w is not None]
        return max(set(windows), key=windows.count) if windows else None

    @property
    def global_rope_theta(self) -> float | None:
        """The RoPE base of the global layers (those carry long-range attention), else of the first layer."""
        bases = [theta for theta, window in zip(self.rope_theta, self.windows, strict=True) if window is None]
        found = [theta for theta in bases or self.rope_theta if theta is not None]
        return found[0] if found else None

    def describe(self) -> str:
        """In words, e.g. `window 64 on layers 0, 2 of 4; RoPE base 10000`."""
        count = len(self.windows)
        sliding = self.sliding_layers
        if not sliding:
            shape = f"{count} global layers"
        else:
            groups: dict[int | None, list[int]] = {}
            for i, window in enumerate(self.windows):
                if window is not None:
                    groups.setdefault(window, []).append(i)
            shape = (
                "; ".join(f"window {w} on layers {_layers(ls)}" for w, ls in groups.items()) + f" of {count}"
            )
        bases: dict[float | None, list[int]] = {}
        for i, theta in enumerate(self.rope_theta):
            bases.setdefault(theta, []).append(i)
        if len(bases) == 1:
            rope = f"RoPE base {_number(next(iter(bases)))}"
        else:
            rope = "RoPE base " + ", ".join(
                f"{_number(t)} on layers {_layers(ls)}" for t, ls in bases.items()
            )
        return f"{shape}; {rope}"

    def differences(self, built: LayerConfig) -> list[str]:
        """Where `built` is not this configuration, one phrase per difference (empty when they agree)."""
        if len(built.windows) != len(self.windows):
            return [f"{len(built.windows)} attention layers where {len(self.windows)} were expected"]
        found = []
        windows = [i for i, (a, b) in enumerate(zip(self.windows, built.windows, strict=True)) if a != b]
        if windows:
            found.append(
                "windows "
                + ", ".join(
                    f"layer {i}: {_window(built.windows[i])} (asked {_window(self.windows[i])})"
                    for i in windows[:6]
                )
                + (f" and {len(windows) - 6} more layers" if len(windows) > 6 else "")
            )
        ropes = [
            i
            for i, (a, b) in enumerate(zip(self.rope_theta, built.rope_theta, strict=True))
            if not _same(a, b)
        ]
        if ropes:
            found.append(
                "RoPE base "
                + ", ".join(
                    f"layer {i}: {_number(built.rope_theta[i])} (asked {_number(self.rope_theta[i])})"
                    for i in ropes[:6]
                )
                + (f" and {len(ropes) - 6} more layers" if len(ropes) > 6 else "")
            )
        return found


class Variant(Record):
    """One engine configuration of a job's model. Written as a name (`global-only`, `window:512`, ...) or as a
    mapping `{name, hf_overrides}` (or `{name, fake}` for the fake engine)."""

    name: str = Field(
        description=f"What the variant is called in curves and comparisons: {_SYNTAX}.", max_length=64
    )
    hf_overrides: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="Changes to the model's Hugging Face config, as vLLM's `hf_overrides` takes them (nested "
        "mappings and lists). A named intervention's are filled in at submit from the model's config.",
    )
    fake: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="Fake engine only: fields of the job's `fake` that this variant changes (e.g. `last`), "
        "so variants of a fake model can differ.",
    )
    expect: LayerConfig | None = Field(
        None,
        description="What vLLM must build, layer by layer, for this variant to run: filled in at submit for "
        "every intervention; None for the model as published (recorded, not checked).",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("name")
    @classmethod
    def _canonical_name(cls, value: str) -> str:
        parsed = parse_intervention(value)
        return parsed.name if parsed is not None else value.strip().lower()

    @field_validator("hf_overrides")
    @classmethod
    def _check_overrides(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        check_overrides(value)
        return value

    @model_validator(mode="after")
    def _named_or_own(self) -> Self:
        parsed = self.intervention
        if parsed is None and not (self.hf_overrides or self.fake):
            raise ValueError(
                f"variant {self.name!r} changes nothing: give it hf_overrides (or fake, for the fake "
                f"engine), or use a named one: {_SYNTAX}"
            )
        if (
            parsed is not None
            and parsed.kind is InterventionKind.baseline
            and (self.hf_overrides or self.fake)
        ):
            raise ValueError(
                "`baseline` is the model as published: give changed settings a name of their own, e.g. "
                "{name: no-softcap, hf_overrides: {...}}"
            )
        return self

    @property
    def intervention(self) -> Intervention | None:
        """The named intervention this variant is, or None for a variant of the user's own."""
        return parse_intervention(self.name)

    @property
    def is_baseline(self) -> bool:
        """True for the model as published."""
        return self.name == BASELINE


def check_overrides(value: Mapping[str, Any], *, where: str = "hf_overrides", depth: int = 0) -> None:
    """Raise `ValueError` unless `value` is a mapping of config field names (identifiers) to JSON values,
    nested at most `MAX_OVERRIDE_DEPTH` deep."""
    if depth > MAX_OVERRIDE_DEPTH:
        raise ValueError(f"{where} is nested more than {MAX_OVERRIDE_DEPTH} deep")
    for key, item in value.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValueError(f"{where}: {key!r} is not a config field name (letters, digits and _)")
        _check_value(item, where=f"{where}.{key}", depth=depth + 1)


def _check_value(item: Any, *, where: str, depth: int) -> None:
    if isinstance(item, Mapping):
        check_overrides(item, where=where, depth=depth)
    elif isinstance(item, list | tuple):
        if depth > MAX_OVERRIDE_DEPTH:
            raise ValueError(f"{where} is nested more than {MAX_OVERRIDE_DEPTH} deep")
        for entry in item:
            _check_value(entry, where=where, depth=depth + 1)
    elif isinstance(item, float) and not math.isfinite(item):
        raise ValueError(f"{where}: {item} is not a finite number")


def merge_overrides(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `extra` on top: mappings merged key by key, anything else replaced."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_overrides(merged[key], value)
        else:
            merged[key] = value
    return merged


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=ROPE_TOLERANCE)


def _window(window: int | None) -> str:
    return "global" if window is None else f"window {window}"


def _number(value: float | None) -> str:
    if value is None:
        return "none"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def _layers(indices: Sequence[int]) -> str:
    """`0-3`, `0, 2`, `0-4, 6-10`."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return ", ".join(f"{a}" if a == b else (f"{a}, {b}" if b == a + 1 else f"{a}-{b}") for a, b in runs)
