"""Reading a job spec: its file, the YAML 1.2 rules it is read by, flags merged over it, and pydantic's
report on it turned into one line that names the field to fix."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from posbias.schemas.bounds import MAX_SPEC_BYTES, MAX_SPEC_DEPTH, check_shape
from posbias.schemas.errors import PosbiasError, one_line


def read_spec_file(path: str | Path, *, what: str = "spec file") -> dict[str, Any]:
    """The mapping a YAML or JSON spec file holds (`.json` is read as JSON, anything else as YAML).

    Only a regular file of at most `MAX_SPEC_BYTES` is read (a FIFO would block, a device never end), as
    UTF-8; YAML is read by the rules of YAML 1.2 (`1:30` is text, not 90; only `true`/`false` are booleans).
    Nesting beyond `MAX_SPEC_DEPTH` or more than `MAX_SPEC_VALUES` values are refused. Every problem is a
    `PosbiasError` naming the file.
    """
    file = Path(path)
    text = _read_text(file, what=what, limit=MAX_SPEC_BYTES)
    try:
        is_json = file.suffix.lower() == ".json"
        data = json.loads(text) if is_json else yaml.load(text, Loader=_SpecLoader)
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
    return data


def _read_text(file: Path, *, what: str, limit: int) -> str:
    try:
        # Non-blocking, so that opening a FIFO returns at once instead of waiting for a writer; the checks
        # are on the open file, so what is read is what was checked.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except IsADirectoryError:
        raise PosbiasError(f"{what} {file} is a folder; give a YAML or JSON file") from None
    except OSError as exc:
        raise PosbiasError(f"cannot read {what} {file}: {exc.strerror or one_line(exc)}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise PosbiasError(f"{what} {file} is a folder; give a YAML or JSON file")
        if not stat.S_ISREG(info.st_mode):
            raise PosbiasError(
                f"{what} {file} is not a regular file (a device or pipe); give a YAML or JSON file"
            )
        if info.st_size > limit:
            raise PosbiasError(f"{what} {file} is {info.st_size:,} bytes; a spec is at most {limit:,} bytes")
        with os.fdopen(fd, "rb") as handle:
            fd = -1  # the handle owns it now
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise PosbiasError(f"cannot read {what} {file}: {exc.strerror or one_line(exc)}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > limit:
        raise PosbiasError(f"{what} {file} is over {limit:,} bytes; a spec is at most {limit:,} bytes")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PosbiasError(
            f"{what} {file} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it "
            "as UTF-8"
        ) from None


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's core schema for plain scalars.

    PyYAML implements YAML 1.1, where `1:30` is the sexagesimal 90, `010` is octal 8 and `yes`/`on`/`no`/
    `off` are booleans: `iterations: 1:30` would silently run 90 iterations. YAML 1.2 (and every other
    modern parser) reads those as text or decimal.
    """


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
