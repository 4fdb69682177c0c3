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
# torch: the locks pin PyPI's version (torch==X, which PEP 440 lets a local X+cpu build
# satisfy) and leave out the CUDA runtime PyPI's Linux wheel needs
# (requirements/torch-cpu.txt), so the CPU build is what gets installed: the wheel in
# pip's find-links directories where the machine has one (read at run time; no path is
# written into the repo; uv takes it, X+cpu sorting above X), else PyTorch's CPU index
# (uv --torch-backend cpu).  Never PyPI's CUDA build, whose runtime the lock lacks.
FIND_LINKS="$("$PY" -m pip config get global.find-links 2>/dev/null || true)"
TORCH="$(sed -n 's/^torch==\([^ ]*\).*/\1/p' "$LOCK")"
EXTRA=()
CPU_TORCH=""
for LINK in $FIND_LINKS; do
  EXTRA+=(--find-links "$LINK")
  if [ -n "$TORCH" ] && compgen -G "$LINK/torch-$TORCH+cpu-*.whl" >/dev/null; then
    CPU_TORCH=1
  fi
done
if [ -n "$TORCH" ] && [ -z "$CPU_TORCH" ]; then
  EXTRA+=(--torch-backend cpu)
fi
[ -x "$VENV/bin/python" ] || $UV venv --quiet --python "$PY" "$VENV"
$UV pip sync --quiet --python "$VENV/bin/python" "${EXTRA[@]}" "$LOCK"
$UV pip install --quiet --python "$VENV/bin/python" --no-deps -e .
