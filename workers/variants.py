"""A job's variants as `hf_overrides` for a model's config, and what vLLM must build for each of them.

A named intervention is defined on what a config says about its attention layers (Hugging Face configs of
transformers 5, as vLLM 0.32's Gemma 2, Gemma 3, Llama and other models read them):

- each layer's kind, `layer_types[i]`: `sliding_attention` layers attend over the last `sliding_window`
  tokens, `full_attention` layers over everything (older configs: Gemma 2 slides on even layers, a
  `sliding_window_pattern` of p makes every p-th layer global);
- the RoPE base, `rope_parameters.rope_theta`, or one per layer kind (`rope_parameters.full_attention`, as
  Gemma 3 has: a layer made global takes the global layers' base there, in transformers and in vLLM alike).

`global-only` makes every layer global, `window:<tokens>` gives the sliding layers another window,
`pattern:<local>:<global>` sets the kinds (that many sliding layers, then that many global ones, repeated),
`rope-base:<value>` (or `x<factor>`) sets the base of the global layers (of every layer when there is one
base). A raw mapping is taken as vLLM takes it (a mapping under a sub-config such as `text_config` is merged
into it; any other value replaces the field) and what it asks is read the way a user means it: a flat
`rope_theta` asks for that base on every layer, a `sliding_window_pattern` for that pattern, even though
vLLM reads neither (vLLM issue 9490: `rope_theta` not applied). The worker compares the expectation with the
model vLLM built (`VllmEngine`), which is what catches an override that was silently ignored.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posbias.schemas import (
    BASELINE,
    InterventionKind,
    LayerConfig,
    PosbiasError,
    Variant,
    one_line,
)
from posbias.schemas.variant import merge_overrides
from posbias.workers.models import check_model_source

SLIDING = "sliding_attention"
FULL = "full_attention"
TEXT_CONFIG = "text_config"
INTENT_KEYS = frozenset(
    {
        "layer_types",
        "sliding_window",
        "sliding_window_pattern",
        "_sliding_window_pattern",
        "use_sliding_window",
        "rope_parameters",
        "rope_theta",
        "rope_local_base_freq",
    }
)
"""Config fields whose effect on the layers is checked after loading. A raw override may name these even where
the config has no such field (older spellings that vLLM may ignore: the check then refuses the variant)."""
NAMED = (
    "global-only",
    "window:<tokens>",
    "pattern:<local>:<global>",
    "rope-base:<value>",
    "rope-base:x<factor>",
)


def read_config(model: str, *, revision: str | None = None, cache_dir: str | Path) -> Any:
    """The transformers config of `model` (folder, GGUF file, `demo` or hub id; a hub model's config is
    downloaded when it is not cached). Raises `PosbiasError` when it cannot be read."""
    from transformers import AutoConfig

    from posbias.workers.gguf_files import converted_folder

    source = check_model_source(model)
    try:
        if source.kind == "folder":
            return AutoConfig.from_pretrained(source.location, trust_remote_code=False)
        if source.kind == "gguf":
            file = Path(source.location)
            converted = converted_folder(file, cache_dir=cache_dir)
            if converted is not None:
                return AutoConfig.from_pretrained(converted, trust_remote_code=False)
            return AutoConfig.from_pretrained(file.parent, gguf_file=file.name, trust_remote_code=False)
        try:
            return AutoConfig.from_pretrained(
                source.location, revision=revision, local_files_only=True, trust_remote_code=False
            )
        except OSError:
            return AutoConfig.from_pretrained(source.location, revision=revision, trust_remote_code=False)
    except (
        Exception
    ) as exc:  # transformers raises OSError, ValueError, KeyError, ... for an unreadable config
        raise PosbiasError(
            f"cannot read the config of {model} to set up its variants: {one_line(exc)}; variants other "
            "than baseline need the model's config (a folder, a GGUF file, or a hub id that can be "
            "downloaded here)"
        ) from None


def config_dicts(config: Any) -> tuple[dict[str, Any], str | None]:
    """The whole config as a dict, and the key of its text sub-config (`text_config`) when the layers are
    described there (multimodal checkpoints such as Gemma 3 4B+), else None."""
    top = config.to_dict() if hasattr(config, "to_dict") else copy.deepcopy(dict(config))
    text = top.get(TEXT_CONFIG)
    if isinstance(text, Mapping) and "num_hidden_layers" in text:
        return top, TEXT_CONFIG
    return top, None


def resolve(
    variants: Sequence[Variant], config: Any, *, job_overrides: Mapping[str, Any] | None = None
) -> tuple[Variant, ...]:
    """`variants` with their `hf_overrides` and `expect` filled in for the model whose config is `config`,
    after the job's own `job_overrides`. Raises `PosbiasError` for a variant the architecture does not
    support, naming what it supports, or for a raw override that names no field of its config."""
    top, text_key = config_dicts(config)
    architecture = _architecture(top)
    job_overrides = dict(job_overrides or {})
    if job_overrides:
        _check_raw(job_overrides, top, text_key=text_key, where="engine.hf_overrides")
    base = apply_overrides(top, job_overrides)
    resolved = []
    for variant in variants:
        if variant.fake:
            resolved.append(variant)
            continue
        intervention = variant.intervention
        if intervention is not None and intervention.kind is InterventionKind.baseline:
            expect = expected_layers(top, job_overrides, text_key=text_key) if job_overrides else None
            resolved.append(variant.model_copy(update={"expect": expect}))
            continue
        if intervention is None:
            _check_raw(variant.hf_overrides, top, text_key=text_key, where=f"variant {variant.name}")
            overrides = variant.hf_overrides
        else:
            text = base[text_key] if text_key else base
            own = _named_overrides(variant, text, architecture=architecture, supported=supported(base))
            overrides = {text_key: own} if text_key else own
            if variant.hf_overrides and variant.hf_overrides != overrides:
                raise PosbiasError(
                    f"variant {variant.name} sets its own hf_overrides; to change the config otherwise, give "
                    "the variant a name of your own, e.g. {name: my-window, hf_overrides: {...}}"
                )
        merged = merge_overrides(job_overrides, overrides)
        expect = expected_layers(top, merged, text_key=text_key)
        resolved.append(variant.model_copy(update={"hf_overrides": overrides, "expect": expect}))
    return tuple(resolved)


def supported(config: Mapping[str, Any]) -> list[str]:
    """The variants a config (a dict, as `config_dicts` gives) supports, for messages."""
    text_key = TEXT_CONFIG if isinstance(config.get(TEXT_CONFIG), Mapping) else None
    text = config[text_key] if text_key else config
    layers = layer_config(text)
    found = [BASELINE]
    if layers is not None and layers.sliding_layers:
        found += ["global-only", "window:<tokens>"]
    if "layer_types" in text and isinstance(text.get("sliding_window"), int):
        found.append("pattern:<local>:<global>")
    if layers is not None and layers.global_rope_theta is not None:
        found += ["rope-base:<value>", "rope-base:x<factor>"]
    return [*found, "a raw hf_overrides mapping"]


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`config` (a dict) with `overrides` applied as vLLM applies them: a mapping under a sub-config (a field
    that is itself a config, e.g. `text_config`) is merged into it, any other value replaces the field."""
    out = copy.deepcopy(dict(config))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) and key == TEXT_CONFIG:
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def expected_layers(
    config: Mapping[str, Any], overrides: Mapping[str, Any], *, text_key: str | None
) -> LayerConfig:
    """What `overrides` ask of `config`'s layers, read as a user means them (see the module's docstring).
    Raises `PosbiasError` when they leave a layer's window or RoPE base undefined."""
    merged = apply_overrides(config, overrides)
    text = merged[text_key] if text_key else merged
    asked = overrides.get(text_key, {}) if text_key else overrides
    asked = asked if isinstance(asked, Mapping) else {}
    text = dict(text)
    if "layer_types" not in asked:
        pattern = asked.get("sliding_window_pattern", asked.get("_sliding_window_pattern"))
        if isinstance(pattern, int) and pattern >= 1 and isinstance(text.get("num_hidden_layers"), int):
            count = int(text["num_hidden_layers"])
            text["layer_types"] = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(count)]
    if "rope_theta" in asked:
        # A flat base asks for that base everywhere, whatever rope_parameters says (vLLM reads the latter).
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": asked["rope_theta"]}
    if "rope_local_base_freq" in asked:
        params = copy.deepcopy(text.get("rope_parameters") or {})
        if not _nested(params):
            params = {FULL: dict(params), SLIDING: dict(params)}
        params.setdefault(SLIDING, {})["rope_theta"] = asked["rope_local_base_freq"]
        text["rope_parameters"] = params
    layers = layer_config(text, strict=True)
    if layers is None:
        raise PosbiasError(
            "the model's config does not say how many layers it has, so a variant cannot be checked"
        )
    return layers


def layer_config(text: Mapping[str, Any], *, strict: bool = False) -> LayerConfig | None:
    """Each layer's window and RoPE base as a text config (a dict) states them; None without a layer count.
    `strict`: a layer kind or RoPE entry that cannot be read is a `PosbiasError` instead of a guess."""
    count = text.get("num_hidden_layers")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    kinds = _kinds(text, count, strict=strict)
    window = text.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        window = None
    windows = tuple(window if kind == SLIDING else None for kind in kinds)
    return LayerConfig(windows=windows, rope_theta=_rope(text, kinds, strict=strict))


def _kinds(text: Mapping[str, Any], count: int, *, strict: bool) -> list[str]:
    window = text.get("sliding_window")
    if not window or text.get("use_sliding_window") is False:
        return [FULL] * count
    types = text.get("layer_types")
    if isinstance(types, list | tuple):
        kinds = [str(kind) for kind in types]
        if strict and (len(kinds) != count or set(kinds) - {SLIDING, FULL}):
            raise PosbiasError(
                f"layer_types needs {count} entries (one per layer), each {SLIDING} or {FULL}; got "
                f"{len(kinds)}: {', '.join(sorted(set(kinds)))}"
            )
        return [kind if kind in (SLIDING, FULL) else FULL for kind in kinds[:count]] + [FULL] * (
            count - len(kinds)
        )
    pattern = text.get("sliding_window_pattern") or text.get("_sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:
        return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(count)]
    if str(text.get("model_type", "")).startswith("gemma2"):
        return [SLIDING if i % 2 == 0 else FULL for i in range(count)]
    return [SLIDING] * count


def _rope(text: Mapping[str, Any], kinds: Sequence[str], *, strict: bool) -> tuple[float | None, ...]:
    params = text.get("rope_parameters")
    if isinstance(params, Mapping) and _nested(params):
        bases = []
        for kind in kinds:
            entry = params.get(kind)
            theta = entry.get("rope_theta") if isinstance(entry, Mapping) else None
            if theta is None and strict:
                raise PosbiasError(
                    f"rope_parameters has no {kind} entry with a rope_theta: vLLM replaces the whole mapping "
                    "(it does not merge it), so give every layer kind's parameters, e.g. "
                    f"{{{SLIDING}: {{rope_type: default, rope_theta: 10000}}, {FULL}: {{...}}}}"
                )
            bases.append(_float(theta))
        return tuple(bases)
    theta = params.get("rope_theta") if isinstance(params, Mapping) else None
    if theta is None:
        theta = text.get("rope_theta")
    local = text.get("rope_local_base_freq")
    return tuple(_float(local if kind == SLIDING and local is not None else theta) for kind in kinds)


def _named_overrides(
    variant: Variant, text: Mapping[str, Any], *, architecture: str, supported: list[str]
) -> dict[str, Any]:
    intervention = variant.intervention
    assert intervention is not None
    layers = layer_config(text)

    def refuse(why: str) -> PosbiasError:
        return PosbiasError(
            f"variant {variant.name}: {architecture} {why}; it supports {', '.join(supported)}"
        )

    if layers is None:
        raise refuse("does not say how many layers it has")
    count = len(layers.windows)
    if intervention.kind is InterventionKind.global_only:
        if not layers.sliding_layers:
            raise refuse("has no sliding-window layer to make global")
        return {"layer_types": [FULL] * count}
    if intervention.kind is InterventionKind.window:
        if not layers.sliding_layers:
            raise refuse("has no sliding-window layer whose window could change")
        return {"sliding_window": intervention.tokens}
    if intervention.kind is InterventionKind.pattern:
        if "layer_types" not in text or not isinstance(text.get("sliding_window"), int):
            raise refuse("states no layer_types and sliding window that a pattern could set")
        assert intervention.local is not None and intervention.global_ is not None
        group = intervention.local + intervention.global_
        return {"layer_types": [SLIDING if i % group < intervention.local else FULL for i in range(count)]}
    assert intervention.kind is InterventionKind.rope_base
    theta = layers.global_rope_theta
    if theta is None:
        raise refuse("states no RoPE base")
    new = intervention.value if intervention.value is not None else theta * (intervention.factor or 1.0)
    params = text.get("rope_parameters")
    if isinstance(params, Mapping) and _nested(params):
        changed = copy.deepcopy(dict(params))
        changed[FULL] = {**changed[FULL], "rope_theta": new}
        return {"rope_parameters": changed}
    if isinstance(params, Mapping) and params.get("rope_theta") is not None:
        return {"rope_parameters": {**copy.deepcopy(dict(params)), "rope_theta": new}}
    return {"rope_theta": new}


def _check_raw(
    overrides: Mapping[str, Any], top: Mapping[str, Any], *, text_key: str | None, where: str
) -> None:
    """A raw override must name fields of the config (or a field whose effect is checked): a misspelt name
    would be set on the config and read by no one."""
    fields = set(top)
    if text_key:
        nested = overrides.get(text_key)
        if isinstance(nested, Mapping):
            _check_raw(nested, top[text_key], text_key=None, where=f"{where}.{text_key}")
    # Where the layers are described under a sub-config, a layer field at the top would be read by no one.
    allowed = INTENT_KEYS if text_key is None else frozenset({text_key})
    unknown = sorted(key for key in overrides if key not in fields and key not in allowed)
    if unknown:
        hint = f" (the layers are described under {text_key}: put the change there)" if text_key else ""
        raise PosbiasError(
            f"{where}: {', '.join(unknown)} is not a field of {_architecture(top)}'s config, so vLLM would "
            f"set it and no layer would read it{hint}; check the spelling against the model's config.json"
        )


def unverified_keys(overrides: Mapping[str, Any], *, text_key: str | None = TEXT_CONFIG) -> list[str]:
    """Override fields whose effect the check after loading does not cover (only windows and RoPE are)."""
    found = []
    for key, value in overrides.items():
        if key == text_key and isinstance(value, Mapping):
            found += [f"{key}.{inner}" for inner in unverified_keys(value, text_key=None)]
        elif key not in INTENT_KEYS:
            found.append(key)
    return found


def _architecture(top: Mapping[str, Any]) -> str:
    names = top.get("architectures") or []
    return str(names[0]) if names else str(top.get("model_type", "the model"))


def _nested(params: Mapping[str, Any]) -> bool:
    return bool(params) and all(isinstance(value, Mapping) for value in params.values())


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
