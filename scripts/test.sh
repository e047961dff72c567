#!/usr/bin/env bash
# The README's test command: set up .venv (quick when done), then run the whole suite.
#   scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -p no:cacheprovider -W ignore::DeprecationWarning "$@"
