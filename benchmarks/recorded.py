"""The guard: what benchmarks/README.md last recorded for a figure, beside what a run measures now.

Each benchmark program prints, under its own table, the figures the README's `### Figures` block of its
section holds for the same setting, the ratio of now to then, and "slower by X%" when now is worse by more
than `SLOWER_BY`. Not a test (these machines are noisy, and the recorded figures come from one of them): a
change that touches a hot path quotes these lines in its closing note.

    from recorded import Guard
    guard = Guard.read("Store")                       # the README's section, by heading
    print(guard.line("postgresql 8/txn rows/s", now=123_456.0, then=guard.store_ingest("postgresql", 8)))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"
SLOWER_BY = 0.10
"""How much worse than recorded a figure must be before it is called slower (runs vary by about ±10% on a
quiet shared machine; benchmarks/README.md)."""

_NUMBER = r"[\d,]+(?:\.\d+)?"


@dataclass(frozen=True)
class ViewFigure:
    """What the Views section recorded for one view at one size."""

    seconds: float | None
    megabytes: float | None
    """Peak MB of the process (for the report page's row: the page's size)."""


@dataclass(frozen=True)
class Guard:
    """The `### Figures` text of one README section, and when it was recorded."""

    section: str
    text: str
    """The lines from the section's `### Figures` heading to its next heading of that level or above."""
    date: str | None
    """The date the figures were recorded (the first `YYYY-MM-DD` under the heading), if stated."""

    @classmethod
    def read(cls, section: str, *, readme: Path = README) -> Guard:
        """The figures of the README section headed `## {section}` (empty when there is none)."""
        lines = readme.read_text(encoding="utf-8").splitlines() if readme.exists() else []
        start = next((i for i, line in enumerate(lines) if line.strip() == f"## {section}"), None)
        if start is None:
            return cls(section=section, text="", date=None)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        body = lines[start + 1 : end]
        figures = next((i for i, line in enumerate(body) if line.strip() == "### Figures"), None)
        if figures is None:
            return cls(section=section, text="", date=None)
        rest = body[figures + 1 :]
        stop = next((i for i, line in enumerate(rest) if re.match(r"#{1,3} ", line)), len(rest))
        text = "\n".join(rest[:stop])
        date = re.search(r"\b(\d{4}-\d{2}-\d{2})\b", text)
        return cls(section=section, text=text, date=date.group(1) if date else None)

    # --- the figures each program records -----------------------------------------------------------

    def store_ingest(self, database: str, per_transaction: int) -> float | None:
        """Store: rows/s recorded for `database` at `per_transaction` shards a transaction."""
        found = re.search(
            rf"^\s+{database}\s+{per_transaction}\s+({_NUMBER})\s+{_NUMBER}\s+{_NUMBER}\s*$",
            self.text,
            re.MULTILINE,
        )
        return _number(found.group(1)) if found else None

    def store_curve_ms(self, database: str) -> float | None:
        """Store: milliseconds recorded for one curve from the aggregates in `database`."""
        block = self.text.split("curve of one model", 1)
        found = (
            re.search(rf"^\s+{database}\s+(\d+\.\d+)\s", block[1], re.MULTILINE) if len(block) > 1 else None
        )
        return _number(found.group(1)) if found else None

    def throughput(self, setting: str) -> dict[str, float]:
        """Throughput: trials/s of (a) and (b), and b/a, recorded for `setting` (e.g. `tiny`); the keys
        present are `a`, `b`, `b/a`."""
        block = re.search(rf"^== {re.escape(setting)}\b.*?(?=^== |\Z)", self.text, re.MULTILINE | re.DOTALL)
        if block is None:
            return {}
        found: dict[str, float] = {}
        for key, pattern in (
            ("a", rf"^\s+\(a\) [^\d\n]*?\s({_NUMBER})\s"),
            ("b", rf"^\s+\(b\) [^\d\n]*?\s({_NUMBER})\s"),
            ("b/a", rf"^\s+b/a \(trials/s\): ({_NUMBER})"),
        ):
            match = re.search(pattern, block.group(0), re.MULTILINE)
            if match:
                found[key] = _number(match.group(1))
        return found

    def views(self, database: str) -> dict[tuple[str, int], ViewFigure]:
        """Views: the figures of `database`'s table (rows = views, columns = results), by (view, results);
        a view that timed out, went over the memory cap or failed has none."""
        lines = self.text.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith(f"{database}: seconds")), None)
        if start is None or start + 1 >= len(lines):
            return {}
        sizes = [int(size.replace(",", "")) for size in re.findall(r"([\d,]+) results", lines[start + 1])]
        found: dict[tuple[str, int], ViewFigure] = {}
        for line in lines[start + 2 :]:
            if not line.strip() or line.startswith("```"):
                break
            label, *cells = re.split(r"\s{2,}", line.strip())
            for size, cell in zip(sizes, cells, strict=False):
                both = re.fullmatch(rf"({_NUMBER}) s(?: \({_NUMBER} s CPU\))?, ({_NUMBER}) MB", cell)
                page = re.fullmatch(rf"({_NUMBER}) MB", cell)
                if both:
                    found[label, size] = ViewFigure(_number(both.group(1)), _number(both.group(2)))
                elif page:
                    found[label, size] = ViewFigure(None, _number(page.group(1)))
        return found

    # --- what is printed ------------------------------------------------------------------------------

    def line(self, label: str, *, now: float, then: float | None, higher_is_better: bool = True) -> str:
        """One line: `label`, now, recorded, now/recorded, and "slower by X%" past `SLOWER_BY`."""
        if then is None or then == 0:
            return f"   {label}: {now:,.3f} now; nothing recorded in benchmarks/README.md ({self.section})"
        ratio = now / then
        worse = 1 - ratio if higher_is_better else 1 - 1 / ratio
        verdict = f"  slower by {worse:.0%}" if worse > SLOWER_BY else ""
        when = f", {self.date}" if self.date else ""
        return (
            f"   {label}: {_shown(now)} now, {_shown(then)} recorded (benchmarks/README.md{when}), "
            f"now/recorded {ratio:.2f}{verdict}"
        )


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _shown(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
