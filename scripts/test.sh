#!/usr/bin/env bash
# The test command: fresh (or reused) .venv from the lock, lint and import contracts, the whole suite on
# Airflow 3.3, then the version-sensitive tests on Airflow 3.1 (scripts/test-airflow31.sh).
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
# The slowest tests, listed at the end: what to trim when the run nears its time budget.
.venv/bin/pytest -q -p no:cacheprovider --durations=25 "$@"
# The oldest supported Airflow (3.1): the version-sensitive tests again, from its own
# lock (skipped when arguments pick tests for the main run).
if [ $# -eq 0 ]; then
  bash scripts/test-airflow31.sh
fi
