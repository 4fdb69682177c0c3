#!/usr/bin/env bash
# The test command (scripts/test.sh) beside a bounded CPU load: two busy processes per
# core, each ending by itself after KINETIC_LOAD_S seconds (default 45 min) and killed
# when the test command ends, whichever is first.  The suite must pass here too: a test
# that fails only under load is a defect of the test or the product (docs/TESTING.md).
# Arguments go to scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
LOAD_S="${KINETIC_LOAD_S:-2700}"
BUSY=$(( 2 * $(nproc) ))
PIDS=()
for _ in $(seq "$BUSY"); do
  timeout "$LOAD_S" python3 -c 'while True: pass' &
  PIDS+=($!)
done
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
echo "== $BUSY busy processes for at most ${LOAD_S}s beside the test command =="
START=$(date +%s)
set +e
bash scripts/test.sh "$@"
RC=$?
echo "== test command under load: exit $RC in $(( $(date +%s) - START ))s =="
exit "$RC"
