#!/usr/bin/env bash
# The demo's settings, left where every later `posbias` command here reads them: `.env` in this folder (the
# settings read it after the environment). MMLU comes from the Hugging Face hub (cais/mmlu) when it is
# reachable; otherwise from a local copy named by POSBIAS_MMLU_DIR. When neither the environment nor `.env`
# names one and there is a copy beside this checkout (../shared/data/mmlu), that copy is added to `.env`
# (whatever else `.env` holds is kept), and one line says so.
set -euo pipefail

env_file=.env
if [ -n "${POSBIAS_MMLU_DIR:-}" ] || [ ! -d ../shared/data/mmlu ]; then
    exit 0
fi
if [ -f "$env_file" ] && grep -qE '^[[:space:]]*(export[[:space:]]+)?POSBIAS_MMLU_DIR[[:space:]]*=' "$env_file"; then
    exit 0
fi
mmlu="$(cd ../shared/data/mmlu && pwd)"
# A last line without its newline would run into ours.
if [ -s "$env_file" ] && [ -n "$(tail -c 1 "$env_file")" ]; then
    printf '\n' >>"$env_file"
fi
printf "POSBIAS_MMLU_DIR='%s'\n" "$mmlu" >>"$env_file"
echo "demo: MMLU is read from $mmlu; saved as POSBIAS_MMLU_DIR in $(pwd)/.env for the next posbias commands here"
