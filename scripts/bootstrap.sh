#!/usr/bin/env bash
# Create .venv from the pinned lock; a no-op (well under a second) when it is current.
# Needs python3 >= 3.11 and the package index; uv itself comes from the package index.
# Usage: bootstrap.sh [LOCK [VENV]]  (default requirements/lock.txt and .venv; the
# Airflow 3.1 run passes requirements/lock-3.1.txt .venv-3.1).
#
# Current means: the stamp file in the venv (VENV/.bootstrap-stamp, written last, so an
# interrupted run is redone) names what the venv was made from, and that is what it would
# be made from now: this checkout (the editable install points at it), the venv's
# Python, the hashes of the lock, of the editable install's inputs (pyproject.toml,
# setup.py and the C source setup.py builds) and of this script, and the C extension that
# the install built (deleted, it is built again).  The check runs before anything else:
# no uv, pip or package index is needed to find a venv current.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
LOCK="${1:-requirements/lock.txt}"
VENV="${2:-.venv}"
STAMP="$VENV/.bootstrap-stamp"
NATIVE_DIR=airflow_provider_kinetic/core/data/hashing
# What the venv is made from (stdout); fails when the venv's Python does not run.
made_from() {
  local version
  version="$("$VENV/bin/python" -c 'import sys; print(sys.version.replace("\n", " "))' \
    2>/dev/null)" || return 1
  echo "checkout: $(pwd -P)"
  echo "python: $version"
  sha256sum "$LOCK" pyproject.toml setup.py "$NATIVE_DIR/_lstatcmp.c" scripts/bootstrap.sh \
    || return 1
  # The extension the editable install built in the source tree (none without a compiler).
  (shopt -s nullglob; for so in "$NATIVE_DIR"/_lstatcmp*.so; do echo "built: $so"; done)
}
if [ -f "$STAMP" ] && NOW="$(made_from)" && [ "$NOW" = "$(cat "$STAMP")" ]; then
  exit 0
fi
rm -f "$STAMP"
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
# A venv whose Python no longer runs (its base interpreter gone) is made again.
"$VENV/bin/python" -c '' 2>/dev/null || $UV venv --quiet --clear --python "$PY" "$VENV"
$UV pip sync --quiet --python "$VENV/bin/python" "${EXTRA[@]}" "$LOCK"
$UV pip install --quiet --python "$VENV/bin/python" --no-deps -e .
# Last: a run stopped before this line leaves no stamp and is redone in full.
NOW="$(made_from)" || { echo "bootstrap.sh: $VENV/bin/python does not run" >&2; exit 1; }
printf '%s\n' "$NOW" >"$STAMP.$$"
mv "$STAMP.$$" "$STAMP"
