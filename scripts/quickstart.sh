#!/usr/bin/env bash
# The README's main-job command: set up .venv (quick when done), then run the CPU quickstart end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ ! -f forge_nb/recipes/quickstart.py ]; then
  echo "quickstart: not there yet (it lands with the example-notebooks issue); set-up is done."
  exit 0
fi
exec .venv/bin/python -m forge_nb.recipes.quickstart "$@"
