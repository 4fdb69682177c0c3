#!/usr/bin/env bash
# The test command: fresh (or reused) .venv from the lock, lint and import contracts, the whole suite on
# Airflow 3.3 and, beside it, the version-sensitive tests on Airflow 3.1 (scripts/test-airflow31.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# Debian's chromium for the browser tests (a no-op when it is there); they fail, not
# skip, when it is missing.
bash scripts/install-browser.sh
export KINETIC_REQUIRE_BROWSER=1
# The stat cache's native comparison (setup.py builds it where gcc exists, as here):
# its tests fail, not skip, when the build silently left it out.
export KINETIC_REQUIRE_NATIVE=1
UV="$(command -v uv || echo "${PYTHON:-python3} -m uv")"
# kinetic itself, for the wire-compatibility tests (its deps are in the lock).
$UV pip install --quiet --python .venv/bin/python --no-deps keras-kinetic==0.0.4
# The wheels the runner-image test installs with --no-index (.artifacts/wheelhouse, at
# the lock's versions, from the package index; a no-op when already built): no test
# reads the machine's uv cache.
.venv/bin/python scripts/wheelhouse.py >/dev/null
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The layers and no import cycles (pyproject.toml [tool.importlinter]).
.venv/bin/lint-imports --no-cache
# No sleep as synchronisation and no wall-clock assertion in the tests (docs/TESTING.md).
.venv/bin/python scripts/check_test_timing.py
# The oldest supported Airflow (3.1): the version-sensitive tests again, from its own
# lock, beside the main run (skipped when arguments pick tests for the main run).  Each
# pytest process works in a temp dir of its own (tests/fixtures/airflow_env.py), so the
# runs do not share local job slots or work dirs; most tests wait on subprocesses, so
# two cores carry the 3.1 run and the main run's two workers together.
# Its venv is made first, not beside the main run: installing the package (editable)
# rebuilds the stat cache's C extension in the source tree, which the main run imports.
LOG31=""
if [ $# -eq 0 ]; then
  bash scripts/bootstrap.sh requirements/lock-3.1.txt .venv-3.1
  LOG31="$(mktemp)"
  KINETIC_VENV31_READY=1 bash scripts/test-airflow31.sh >"$LOG31" 2>&1 &
  PID31=$!
fi
# The main run on Airflow 3.3, in two worker processes (one test module per worker:
# module fixtures such as an `airflow standalone` stay in one process).  The slowest
# tests are listed at the end: what to trim when the run nears its time budget.
set +e
.venv/bin/pytest -q -p no:cacheprovider -n "${KINETIC_TEST_WORKERS:-2}" --dist loadfile \
  --durations=25 "$@"
RC=$?
RC31=0
if [ -n "$LOG31" ]; then
  wait "$PID31"
  RC31=$?
  echo "== Airflow 3.1 (scripts/test-airflow31.sh) =="
  cat "$LOG31"
  rm -f "$LOG31"
fi
echo "Airflow 3.3 run: exit $RC; Airflow 3.1 run: exit $RC31"
[ "$RC" -eq 0 ] && [ "$RC31" -eq 0 ]
