#!/usr/bin/env bash
# Create .venv from the pinned lock (idempotent).  Needs python3 >= 3.11 and the
# package index; uv itself comes from the package index.
# Usage: bootstrap.sh [LOCK [VENV]]  (default requirements/lock.txt and .venv; the
# Airflow 3.1 run passes requirements/lock-3.1.txt .venv-3.1).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
LOCK="${1:-requirements/lock.txt}"
VENV="${2:-.venv}"
if ! command -v uv >/dev/null 2>&1; then
  "$PY" -m pip install --quiet uv
fi
UV="$(command -v uv || echo "$PY -m uv")"
# torch==2.13.0+cpu: the CPU wheel comes from pip's find-links directory when the
# machine has one (read at run time; the path is not written into the repo).
FIND_LINKS="$("$PY" -m pip config get global.find-links 2>/dev/null || true)"
EXTRA=()
[ -n "$FIND_LINKS" ] && EXTRA+=(--find-links "$FIND_LINKS")
[ -x "$VENV/bin/python" ] || $UV venv --quiet --python "$PY" "$VENV"
$UV pip sync --quiet --python "$VENV/bin/python" "${EXTRA[@]}" "$LOCK"
$UV pip install --quiet --python "$VENV/bin/python" --no-deps -e .
