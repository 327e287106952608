"""A real headless browser for the report and viewer tests: Debian's `chromium` driven through its
`chromedriver` by selenium, with the browser's console and network events recorded (`Browser`), and jobs of
the fake engine run in this process to look at (`run_fake_job`).

Install what it needs (scripts/test.sh does): `apt-get install -y chromium chromium-driver` and
`pip install selenium`. `missing()` says what is absent, for a test's skip reason.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from posbias.schemas import JobSpec, Question, QuestionPool
from posbias.service.store.database import Database
from posbias.service.work import jobs, planner, queue
from posbias.workers.fake_engine import FakeEngine
from posbias.workers.shard import run_shard

CHROMIUM = ("chromium", "chromium-browser")
CHROMEDRIVER = "chromedriver"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
"""Where the browser tests leave their screenshots, for a person to look at."""


def missing() -> str | None:
    """Why the browser tests cannot run here (None when they can): what to install."""
    if not any(shutil.which(name) for name in CHROMIUM) or not shutil.which(CHROMEDRIVER):
        return "chromium and chromedriver are not installed: apt-get install -y chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install selenium"
    return None


@dataclass
class Browser:
    """One headless chromium: load pages, click, read what it logged and which URLs it asked for."""

    driver: Any
    seen: set[str] = field(default_factory=set)
    """Every URL a page requested since the browser started (from the performance log)."""

    def load(self, url: str) -> None:
        """Open `url` and wait until the page's script has drawn it."""
        self.driver.get(url)
        self.wait_for("#app > *")

    def wait_for(self, css: str, *, timeout: float = 10) -> Any:
        """The first element matching `css` once one is displayed."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout).until(
            lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()), False)
        )

    def count(self, css: str) -> int:
        """How many elements match `css` (drawn or not)."""
        from selenium.webdriver.common.by import By

        return len(self.driver.find_elements(By.CSS_SELECTOR, css))

    def click(self, css: str) -> None:
        """Click the first element matching `css` as a user would (scrolled into view; SVG too)."""
        element = self.wait_for(css)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
        from selenium.webdriver.common.action_chains import ActionChains

        ActionChains(self.driver).move_to_element(element).click().perform()

    def console_errors(self) -> list[str]:
        """Console messages of level error or worse (uncaught exceptions, refused requests) since the last
        call."""
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] in {"SEVERE", "ERROR"}]

    def requested(self) -> set[str]:
        """Every URL requested since the browser started (network events of the performance log)."""
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message.get("method") == "Network.requestWillBeSent":
                self.seen.add(message["params"]["request"]["url"])
        return set(self.seen)

    def leaving(self) -> set[str]:
        """Requested URLs that go anywhere but this machine (127.0.0.1, or the file the page is)."""
        local = {"127.0.0.1", "localhost"}
        return {
            url
            for url in self.requested()
            if urlparse(url).scheme not in {"file", "data", "about"} and urlparse(url).hostname not in local
        }

    def screenshot(self, name: str) -> Path:
        """Save the whole page as build/screenshots/NAME.png."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1280, min(max(int(height), 800), 6000))
        self.driver.save_screenshot(str(path))
        self.driver.set_window_size(1280, 900)
        return path


@contextmanager
def browser() -> Iterator[Browser]:
    """A headless chromium with console and performance logging, closed on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    binary = next(path for name in CHROMIUM if (path := shutil.which(name)))
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which(CHROMEDRIVER)), options=options)
    try:
        yield Browser(driver=driver)
    finally:
        driver.quit()


MARKUP_QUESTION = 66


def question_pool(size: int = 80) -> QuestionPool:
    """`size` four-option questions over three subjects, with a sentence of text each."""
    subjects = ("anatomy", "astronomy", "virology")
    questions = tuple(
        Question(
            id=f"{subjects[i % 3]}/q{i:04d}",
            subject=subjects[i % 3],
            # Question 66 (which the tests' seeds 0 to 2 all draw) holds markup: the pages must show it as
            # text, never render or run it.
            question=f"Which of these is the right answer to question number {i}?"
            + (" <b>bold</b></script><script>alert(1)</script>" if i == MARKUP_QUESTION else ""),
            choices=(f"option a{i}", f"option b{i}", f"option c{i}", f"option d{i}"),
            answer=i % 4,
        )
        for i in range(size)
    )
    return QuestionPool(
        questions=tuple(sorted(questions, key=lambda q: q.id)), subjects=subjects, source="test"
    )


def run_fake_job(db: Database, spec: Mapping[str, Any], *, shards: int | None = None) -> int:
    """Submit a job of the fake engine (`spec` over a small default) and run its shards (all of them, or
    the first `shards`) in this process as a worker would: leased from the queue, answered by the fake
    engine of its variant, written back. Returns the job id."""
    values: dict[str, Any] = {
        "model": "fake/gemma-like",
        "engine": {"name": "fake"},
        "batch_sizes": [4],
        "iterations": 6,
        "shard_size": 3,
        "answer_mode": "constrained",
        **spec,
    }
    job_spec = JobSpec.model_validate(values)
    job_id = jobs.submit(db, job_spec, planner.plan(job_spec, pool=question_pool())).job_id
    finish_fake_job(db, job_id, shards=shards)
    return job_id


def finish_fake_job(db: Database, job_id: int, *, shards: int | None = None) -> None:
    """Run `job_id`'s queued shards (or the first `shards` of them) on the fake engine, in this process."""
    spec = jobs.get(db, job_id).spec
    left = shards
    while left is None or left > 0:
        leases = queue.lease(db, owner="test", limit=1, lease_seconds=60, job_ids=[job_id])
        if not leases:
            return
        shard = leases[0].shard
        seed = shard.fake.seed if shard.fake.seed is not None else spec.seed
        engine = FakeEngine(shard.fake, seed=seed, model=shard.model)
        assert queue.complete(db, [run_shard(shard, engine=engine)], owner="test")[0].written
        left = None if left is None else left - 1
