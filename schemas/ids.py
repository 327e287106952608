"""Ids as people write them: in a URL, a flag, a file. One rule everywhere an id is read from text: the ASCII
digits 0-9 and nothing else, from 1 to the stores' 64-bit largest.

Python's own readers are looser: `int` reads a full-width 2 (U+FF12) and an Arabic-Indic 3 (U+0663) as 2
and 3, and `1_0`, ` 1` and `+1` as 10, 1 and 1; `str.isdigit` passes a superscript 2 (U+00B2), which `int`
then refuses. An id that passes here
names the job the user typed, or none. Free of pydantic, so the command can check a flag before it loads the
records.
"""

from __future__ import annotations

from posbias.schemas.errors import UsageError
from posbias.schemas.limits import INT64_MAX

ID_MAX = INT64_MAX
"""Ids are 64-bit in both stores: a larger one is a usage error, not a driver's overflow."""


def parse_id(text: str, *, what: str = "job id") -> int:
    """`text` as an id: ASCII digits only, 1 to `ID_MAX`. `UsageError` naming `what` (e.g. `trial id`)
    otherwise, on one line, quoting at most 30 characters of `text`."""
    if not (text.isascii() and text.isdigit()):
        shown = repr(text if len(text) <= 30 else text[:27] + "...")
        raise UsageError(f"{shown} is not a {what}: write it in the digits 0-9 only, e.g. 12")
    if len(text) > len(str(ID_MAX)) or not 1 <= int(text) <= ID_MAX:
        raise UsageError(f"{what} {text[:30]} is out of range (1 to {ID_MAX})")
    return int(text)


def looks_like_id(text: str) -> bool:
    """`text` is digits of any script (ASCII, full-width, superscript...): meant as an id, so `parse_id`
    should read it (and refuse what is not ASCII) rather than it being taken for a name."""
    return bool(text) and text.isdigit()
