"""Per-tier totals of a pytest run, read from its JUnit XML (scripts/test.sh writes build/junit.xml).

A test's time there is its setup, call and teardown, so a session fixture (a PostgreSQL server, a Ray, a vLLM
engine) counts in the tier of the first test that needed it.

    python scripts/tier_times.py build/junit.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

# Most specific first: tests/integration/engine is the engine tier, the rest of tests/integration integration.
TIERS = (
    ("tests.integration.engine", "engine"),
    ("tests.integration.served", "served"),
    ("tests.integration", "integration"),
    ("tests.unit", "unit"),
    ("tests.deploy", "deploy"),
    ("tests.e2e", "e2e"),
)


def tier_of(classname: str) -> str:
    return next((tier for prefix, tier in TIERS if classname.startswith(prefix)), "other")


def main(path: str) -> None:
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for case in ET.parse(path).getroot().iter("testcase"):
        tier = tier_of(case.get("classname", ""))
        seconds[tier] += float(case.get("time", 0))
        counts[tier] += 1
    order = [tier for _, tier in TIERS] + ["other"]
    print(f"{'tier':<12} {'tests':>6} {'seconds':>9} {'minutes':>8}")
    for tier in sorted(seconds, key=order.index):
        print(f"{tier:<12} {counts[tier]:>6} {seconds[tier]:>9.0f} {seconds[tier] / 60:>8.1f}")
    total = sum(seconds.values())
    print(f"{'all':<12} {sum(counts.values()):>6} {total:>9.0f} {total / 60:>8.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/junit.xml")
