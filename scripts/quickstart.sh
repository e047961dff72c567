#!/usr/bin/env bash
# The README's main-job command: set up .venv (quick when done), then run the CPU quickstart notebook
# headless. Leaves in outputs/ the executed notebook, an HTML report with the curves and the run
# directory, and prints where they are and the final reward.
#   scripts/quickstart.sh [--steps N] [--outputs DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python scripts/run_notebook.py example_notebooks/01_quickstart.py "$@"
