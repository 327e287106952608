"""Redraw the README's gallery: the pictures of the pages posbias makes, taken in the real headless Chromium.

    python scripts/gallery.py            # writes docs/report.png and docs/diagnosis.png

In a fresh SQLite store in a temporary folder it runs the guide's worked example on the fake engine
(docs/diagnose.md: a window mechanism, `posbias diagnose fake/window --engine fake ... --budget 400`), runs
the jobs (`posbias worker --until-empty`, here on a local Ray), then writes the report of the diagnosis's
behaviour and intervention jobs (`posbias report B I --out report.html`) and the diagnosis's page
(`--html diagnosis.html`), and takes the top of each in Chromium at 1280 x 900. Each picture is cut to 256
colours (Pillow) to stay under about 150 KB. Needs what the browser tests need: Debian's `chromium` (and
MMLU: POSBIAS_MMLU_DIR).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import posbias
from posbias.service.settings import Settings

REPO = Path(__file__).resolve().parents[1]
FAKE = {"window": 1000, "mechanism": {"window_step": 0.3}}
"""The guide's worked example: answers beyond the fake's 1,000-token window lose 30 points."""
SIZE = (1280, 900)
MAX_BYTES = 150_000


def chromium() -> str:
    """The headless browser's binary, or exit naming the install."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        sys.exit("gallery: no chromium here: apt-get install -y chromium")
    return found


def screenshot(page: Path, out: Path, *, browser: str) -> None:
    """The top of `page` (SIZE) as a PNG of at most 256 colours at `out`, once its script has run."""
    raw = out.with_suffix(".raw.png")
    subprocess.run(
        [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-background-networking",
            f"--window-size={SIZE[0]},{SIZE[1]}",
            "--virtual-time-budget=10000",  # the report's charts are drawn by its script
            f"--screenshot={raw}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
    )
    from PIL import Image

    with Image.open(raw) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        small.save(out, optimize=True)
    raw.unlink()
    size = out.stat().st_size
    print(f"wrote {out} ({size / 1000:.0f} KB)")
    if size > MAX_BYTES:
        print(f"  more than {MAX_BYTES / 1000:.0f} KB: the README's pictures should stay small")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="folder for the pictures")
    args = parser.parse_args()
    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="posbias-gallery-") as folder:
        here = Path(folder)
        settings = Settings(
            database_url=f"sqlite:///{here / 'posbias.db'}",
            cache_dir=here / "cache",
            mmlu_dir=Settings().mmlu_dir,
            ray_address="local",
        )
        posbias.upgrade_store(settings=settings)
        submitted = posbias.diagnose("fake/window", engine="fake", fake=FAKE, budget=400, settings=settings)
        posbias.dispatch(settings=settings, until_empty=True)
        outcome = posbias.diagnose("fake/window", engine="fake", fake=FAKE, budget=400, settings=settings)
        if outcome.diagnosis is None:
            sys.exit(f"gallery: the diagnosis's jobs did not finish: {outcome.jobs}")
        ids = [job.job_id for job in submitted.jobs]
        report = here / "report.html"
        posbias.report(ids[:2], out=report, settings=settings)
        page = posbias.write_diagnosis(outcome.diagnosis, path=here / "diagnosis.html")
        args.out.mkdir(parents=True, exist_ok=True)
        screenshot(report, args.out / "report.png", browser=browser)
        screenshot(page, args.out / "diagnosis.png", browser=browser)


if __name__ == "__main__":
    main()
