#!/usr/bin/env bash
# Every test tier: ruff, mypy, unit, integration (a throwaway PostgreSQL, a local Ray, vLLM on CPU), deploy
# checks, e2e.
# Extra arguments go to pytest (e.g. scripts/test.sh -x -k queue).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
. .venv/bin/activate

# The tests start their own PostgreSQL from the server binaries; install them where they are missing.
if ! command -v pg_config >/dev/null || [ ! -x "$(pg_config --bindir)/initdb" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "PostgreSQL server binaries are missing: install them (e.g. apt-get install postgresql)" >&2
        exit 1
    fi
fi

# The report and viewer tests drive a real headless browser: Debian's Chromium and its ChromeDriver.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "Chromium and ChromeDriver are missing: install them (e.g. apt-get install chromium chromium-driver)" >&2
        exit 1
    fi
fi

# PostgreSQL refuses to run as root: under root the tests run the server as the `postgres` system user.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home postgres
fi

ruff check .
ruff format --check .
scripts/typecheck.sh   # mypy over the package as installed (see the script)
# The per-tier totals (unit, integration, engine, served, deploy, e2e) print after the 40 slowest tests,
# whether the run passed or not.
mkdir -p build && rm -f build/junit.xml
status=0
# Two workers (pytest-xdist): run one at a time, the tests leave a core idle about half the time, waiting on
# servers and processes. Each test file is one group (its fixtures set up once), the engine tests one group
# (tests/conftest.py). POSBIAS_TEST_WORKERS=0 runs them in this process, one at a time.
workers=${POSBIAS_TEST_WORKERS:-2}
python -m pytest tests -n "$workers" --dist loadgroup --durations=40 --junitxml=build/junit.xml "$@" || status=$?
[ -f build/junit.xml ] && python scripts/tier_times.py build/junit.xml
exit "$status"
