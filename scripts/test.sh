#!/usr/bin/env bash
# The test command: fresh (or reused) .venv from the lock, lint, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
UV="$(command -v uv || echo "${PYTHON:-python3} -m uv")"
# kinetic itself, for the wire-compatibility tests (its deps are in the lock).
$UV pip install --quiet --python .venv/bin/python --no-deps keras-kinetic==0.0.4
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
