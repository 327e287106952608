#!/usr/bin/env bash
# mypy over posbias as installed. The build maps schemas/, service/, workers/ and migrations/ onto
# posbias.* (pyproject.toml's package-dir); the editable install does that with an import hook that mypy cannot
# follow, so this installs the package's files into build/typecheck (no dependencies, a few seconds) and
# checks them there, with each message's path turned back into the file in this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
target=build/typecheck
rm -rf "$target" build/lib   # build/lib: setuptools stages files there and would carry a deleted module along
python -m pip install --quiet --no-deps --no-build-isolation --no-compile --target "$target" . >/dev/null
status=0
(cd "$target" && python -m mypy --config-file "$repo/pyproject.toml" --cache-dir "$repo/.mypy_cache" -p posbias) \
    > build/typecheck.log 2>&1 || status=$?
sed -E 's#^posbias/(schemas|service|workers|migrations)/#\1/#' build/typecheck.log
exit "$status"
