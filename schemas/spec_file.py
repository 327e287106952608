"""Reading a job spec: its file, the YAML 1.2 rules it is read by, flags merged over it, and pydantic's
report on it turned into one line that names the field to fix."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from posbias.schemas.bounds import MAX_SPEC_BYTES, MAX_SPEC_DEPTH, check_shape
from posbias.schemas.errors import PosbiasError, one_line
from posbias.schemas.files import read_text


def read_spec_file(path: str | Path, *, what: str = "spec file") -> dict[str, Any]:
    """The mapping a YAML or JSON spec file holds (`.json` is read as JSON, anything else as YAML).

    Only a regular file of at most `MAX_SPEC_BYTES` is read (a FIFO would block, a device never end), as
    UTF-8; YAML is read by the rules of YAML 1.2 (`1:30` is text, not 90; only `true`/`false` are booleans).
    Nesting beyond `MAX_SPEC_DEPTH`, more than `MAX_SPEC_VALUES` values, and a key given twice in one mapping
    (JSON and YAML parsers keep the last, silently) are refused. Every problem is a `PosbiasError` naming the
    file. Relative paths in it are read from the file's folder, not the working folder (`resolve_paths`),
    so the same file names the same data wherever it is run from.
    """
    file = Path(path)
    text = read_text(file, what=what, fix="give a YAML or JSON file", limit=MAX_SPEC_BYTES, noun="a spec")
    try:
        is_json = file.suffix.lower() == ".json"
        data = json.loads(text, object_pairs_hook=_unique) if is_json else yaml.load(text, Loader=_SpecLoader)
    except _DuplicateKey as exc:
        raise PosbiasError(
            f"{what} {file} gives {exc.key} twice{exc.where}; keep the one you mean and delete the other"
        ) from None
    except (yaml.YAMLError, ValueError) as exc:
        raise PosbiasError(f"{what} {file} is not valid YAML/JSON: {one_line(exc)}") from None
    except RecursionError:
        raise PosbiasError(f"{what} {file} nests too deeply (at most {MAX_SPEC_DEPTH} levels)") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PosbiasError(f"{what} {file} must hold a mapping of fields, e.g. `model: ...`")
    problem = check_shape(data)
    if problem:
        raise PosbiasError(f"{what} {file}: {problem}")
    return resolve_paths(data, folder=file.absolute().parent)


LOCAL_PREFIXES = ("./", "../")
"""How a spec names a model or tokenizer folder relative to itself: anything else may be a hub id."""


def resolve_paths(data: dict[str, Any], *, folder: Path) -> dict[str, Any]:
    """`data` (a spec file's fields) with its relative paths made absolute from `folder`, the spec file's:
    `dataset.path` and a filler `source` file when not absolute, and `model` and `tokenizer` when they start
    with `./` or `../` (without, they may be hub ids). Values of other types are left for validation to
    refuse."""
    resolved = dict(data)
    for key in ("model", "tokenizer"):
        value = resolved.get(key)
        if isinstance(value, str) and value.startswith(LOCAL_PREFIXES):
            resolved[key] = _from(folder, value)
    for block, key, keep in (("dataset", "path", ""), ("filler", "source", "builtin")):
        part = resolved.get(block)
        value = part.get(key) if isinstance(part, dict) else None
        if isinstance(part, dict) and isinstance(value, str) and _relative(value, keep=keep):
            resolved[block] = {**part, key: _from(folder, value)}
    return resolved


def _relative(value: str, *, keep: str) -> bool:
    return value not in {"", keep} and "://" not in value and not Path(value).expanduser().is_absolute()


def _from(folder: Path, value: str) -> str:
    # normpath, not resolve(): a symbolic link in the path stays as the user wrote it.
    return os.path.normpath(folder / value)


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's core schema for plain scalars.

    PyYAML implements YAML 1.1, where `1:30` is the sexagesimal 90, `010` is octal 8 and `yes`/`on`/`no`/
    `off` are booleans: `iterations: 1:30` would silently run 90 iterations. YAML 1.2 (and every other
    modern parser) reads those as text or decimal.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Keys merged in with `<<` may be overridden (that is what a merge is for); keys written out may not.
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise _DuplicateKey(json.dumps(key, default=str), where=f" (line {line})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(ValueError):
    def __init__(self, key: str, *, where: str = "") -> None:
        super().__init__(key)
        self.key, self.where = key, where


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(json.dumps(key))
        data[key] = value
    return data


_BOOL, _INT, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in {_BOOL, _INT, _FLOAT}]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_SpecLoader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_SpecLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    if text.startswith(("0o", "0x")):
        return int(text, 0)
    return int(text, 10)


_SpecLoader.add_constructor(_INT, _yaml12_int)


def describe_validation_error(exc: ValidationError) -> str:
    """One line for the first problem pydantic found, e.g. `batch_sizes: must be between 1 and 200`."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "spec"
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown field (check its spelling in the spec reference: posbias submit --help)"
    more = len(exc.errors()) - 1
    return f"{where}: {message}" + (f" (and {more} more)" if more else "")


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` (e.g. CLI flags) in place of its values; mappings are merged key by key."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_overrides(merged[key], value)
        else:
            merged[key] = value
    return merged
