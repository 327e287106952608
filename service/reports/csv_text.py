"""Arrow record batches as CSV, byte for byte as Python's `csv.writer` writes the same rows (the export's CSV
was written so, one Python row per answer, and what reads it, a script comparing `correct == "True"` too,
should not see a difference): fields separated by commas, lines ended by CRLF, a field quoted (its quotes
doubled) only where it holds a comma, a quote, CR or LF, a null as the empty field, booleans as `True` and
`False`, integers in decimal and floats as Python's `repr` writes them.

Every column is turned into text by Arrow's compute functions and the lines are joined there, so a batch of
a million rows is a few array operations, not a million Python rows. Arrow writes a float as Python does
between 1e-4 and 1e4 but for the ".0" of a whole number; below 1e-4 it writes 0.00001 or 1e-7 where Python
writes 1e-05 and 1e-07, which is rewritten here; past 1e4 it changes to exponents elsewhere than Python, so
those few values (the export's one float column is a probability) are written by `repr` itself.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

_REPR_BY_ARROW_BELOW = 1e4
"""Floats of at least this magnitude are written by Python's `repr` (see the module's docstring)."""


def header(names: Sequence[str]) -> bytes:
    """The header line of columns `names`, as `csv.writer` writes it."""
    text = io.StringIO(newline="")
    csv.writer(text).writerow(names)
    return text.getvalue().encode()


def lines(batch: pa.RecordBatch) -> pa.Buffer:
    """The rows of `batch` as CSV lines (UTF-8), as `csv.writer` writes them. Its columns are integers,
    floats, booleans or strings (lists go as their JSON text)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    fields = [field_text(batch.column(i)) for i in range(batch.num_columns)]
    joined = pc.binary_join_element_wise(*fields, ",")
    line = pc.binary_join_element_wise(joined, pa.scalar(""), "\r\n")  # each line ended by CRLF
    _, offsets, data = line.buffers()
    if data is None or not len(line):
        return pa.py_buffer(b"")
    bounds = np.frombuffer(offsets, dtype=np.int32, count=len(line) + 1, offset=4 * line.offset)
    start, end = int(bounds[0]), int(bounds[-1])
    return data.slice(start, end - start)


def field_text(values: pa.Array) -> pa.Array:
    """Each value of `values` as `csv.writer` writes it as a field (quoted where it must be)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = values.type
    if pa.types.is_boolean(kind):
        text = pc.if_else(values, "True", "False")
    elif pa.types.is_floating(kind):
        text = python_floats(values.cast(pa.float64()))
    elif pa.types.is_integer(kind):
        text = values.cast(pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = _quoted(values.cast(pa.string()))
    else:
        raise TypeError(f"no CSV text for a column of {kind}")
    return pc.fill_null(text, "")


def python_floats(values: pa.Array) -> pa.Array:
    """Each float of `values` as Python's `repr` writes it (nulls stay null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = values.cast(pa.string())
    # A whole number: Arrow writes 1, Python 1.0.
    whole = pc.match_substring_regex(text, r"^-?[0-9]+$")
    text = pc.if_else(whole, pc.binary_join_element_wise(text, ".0", ""), text)
    # Between 1e-6 and 1e-4 Arrow writes decimals, Python exponents of two digits.
    for zeros, exponent in (("0000", "05"), ("00000", "06")):
        text = pc.replace_substring_regex(text, rf"^(-?)0\.{zeros}([1-9])([0-9]*)$", rf"\1\2.\3e-{exponent}")
    text = pc.replace_substring(text, ".e", "e")  # one digit: 1.e-05 is 1e-05
    text = pc.replace_substring_regex(text, r"e([+-])([0-9])$", r"e\10\2")  # 1e-7 is 1e-07
    far = pc.fill_null(
        pc.and_(pc.is_finite(values), pc.greater_equal(pc.abs(values), _REPR_BY_ARROW_BELOW)), False
    )
    if pc.any(far).as_py():
        written = pa.array([repr(v) for v in values.filter(far).to_pylist()], pa.string())
        text = pc.replace_with_mask(text, far, written)
    return text


def _quoted(text: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    special = pc.fill_null(pc.match_substring_regex(text, '[,"\r\n]'), False)
    if not pc.any(special).as_py():
        return text
    quoted = pc.binary_join_element_wise('"', pc.replace_substring(text, '"', '""'), '"', "")
    return pc.if_else(special, quoted, text)
