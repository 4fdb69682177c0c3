#!/usr/bin/env bash
# The main job: run the example retraining DAG end to end on the local backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python scripts/run_example.py "$@"
