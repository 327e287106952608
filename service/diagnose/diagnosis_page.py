"""A diagnosis as one self-contained HTML page: the verdict per suspect, each line's finding with its
interval, every number linked to the jobs it comes from as `posbias view` serves them (`/job/<id>`, whose page
draws each of the job's variants: the variant a finding compares with the baseline is named beside it)."""

from __future__ import annotations

import html

from posbias.schemas import Interval
from posbias.schemas.diagnosis import Diagnosis, Finding

STYLE = (
    "body{font:14px system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:.3em .6em;vertical-align:top;text-align:left}"
    ".implicated{background:#fde2e1}.ruled-out{background:#e3f4e1}.cannot-tell{background:#fff6d6}"
)


def diagnosis_page(diagnosis: Diagnosis, *, base_url: str = "") -> str:
    """The page's HTML; links are relative to `base_url` (a viewer's address, or empty: the viewer's own
    pages)."""
    base_url = base_url.rstrip("/")
    rows = []
    for verdict in diagnosis.suspects:
        span = len(verdict.findings)
        for i, finding in enumerate(verdict.findings):
            head = (
                f'<td rowspan="{span}">{html.escape(verdict.suspect.value)}</td>'
                f'<td rowspan="{span}" class="{_cls(verdict.call.value)}"><b>{verdict.call.value}</b><br>'
                f"{html.escape(verdict.agreement)}</td>"
                if i == 0
                else ""
            )
            rows.append(
                f"<tr>{head}<td>{finding.line.value}</td>"
                f'<td class="{_cls(finding.call.value)}">{finding.call.value}</td>'
                f"<td>{html.escape(finding.measure)}</td><td>{_number(finding, base_url)}</td>"
                f"<td>{html.escape(finding.reason)}{_settle(finding)}</td></tr>"
            )
    jobs = ", ".join(f'<a href="{base_url}/job/{j}">{j}</a>' for j in diagnosis.job_ids)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>diagnosis of "
        f"{html.escape(diagnosis.model)}</title><style>{STYLE}</style></head><body>"
        f"<h1>Diagnosis of {html.escape(diagnosis.model)}</h1>"
        f"<p>{html.escape(diagnosis.summary)} Batch size {diagnosis.batch_size}; jobs {jobs}.</p>"
        + _viewer_note(base_url)
        + "<table><tr><th>suspect</th><th>verdict</th><th>line</th><th>call</th><th>measure</th>"
        "<th>effect (points, 95%)</th><th>why (and what would settle it)</th></tr>"
        + "".join(rows)
        + "</table></body></html>\n"
    )


def interval_text(effect: Interval | None, *, digits: int = 1) -> str:
    """`-29.8 (-35.1 to -24.5)`; empty for none."""
    if effect is None or effect.estimate is None:
        return ""
    if effect.low is None or effect.high is None:
        return f"{effect.estimate:+.{digits}f}"
    return f"{effect.estimate:+.{digits}f} ({effect.low:+.{digits}f} to {effect.high:+.{digits}f})"


def _settle(finding: Finding) -> str:
    if not finding.settle or finding.settle == finding.reason:
        return ""
    return f"<br><i>to settle:</i> {html.escape(finding.settle)}"


def _number(finding: Finding, base_url: str) -> str:
    digits = 2 if finding.unit == "AUROC" else 1
    text = interval_text(finding.effect, digits=digits) or (
        f"+/-{finding.bound:.{digits}f}" if finding.bound is not None else ""
    )
    if text and finding.unit != "points":
        text = f"{text} {finding.unit}"
    if not finding.job_ids:
        return html.escape(text)
    # A job's page in `posbias view` draws every variant of it, the baseline and the variant compared here
    # among them (the viewer's /compare takes two jobs, not two variants of one).
    first = f"{base_url}/job/{finding.job_ids[0]}"
    number = f'<a class="number" href="{first}">{html.escape(text)}</a> ' if text else ""
    links = ", ".join(f'<a class="job" href="{base_url}/job/{j}">{j}</a>' for j in finding.job_ids)
    variant = f", variant {html.escape(finding.variant)}" if finding.variant else ""
    return f"{number}(job{'s' if len(finding.job_ids) > 1 else ''} {links}{variant})"


def _viewer_note(base_url: str) -> str:
    if not base_url.startswith("http://127.0.0.1:"):
        return ""
    port = base_url.rsplit(":", 1)[1]
    return f'<p class="viewer">Each number opens its job in <code>posbias view --port {port}</code>.</p>'


def _cls(call: str) -> str:
    return call.replace(" ", "-")
