#!/usr/bin/env bash
# The oldest supported Airflow (3.1): .venv-3.1 from requirements/lock-3.1.txt (built
# like scripts/bootstrap.sh builds .venv), then the tests where Airflow versions differ:
# dag.test() DAG runs, deferrable triggers, the try rule, the connection form and
# provider info, two `airflow standalone` runs (mark a deferred task failed across a
# triggerer restart; clear one), and `python -m airflow_provider_kinetic.cli` (3.1 does
# not load provider CLI commands, so `airflow kinetic` is absent there).
# Called by scripts/test.sh beside the main suite; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-3.1
# (scripts/test.sh makes it before starting the main run beside this one.)
if [ -z "${KINETIC_VENV31_READY:-}" ]; then
  bash scripts/bootstrap.sh requirements/lock-3.1.txt "$VENV"
fi
"$VENV/bin/python" -c 'import airflow; assert airflow.__version__.startswith("3.1."), airflow.__version__'
# The 3.3-only test reads the declarative form's widgets from ProvidersManager;
# test_airflow_versions.py checks the form on both versions instead.
exec "$VENV/bin/pytest" -q -p no:cacheprovider \
  tests/unit/test_provider_info.py \
  --deselect tests/unit/test_provider_info.py::test_providers_manager_sees_every_component_and_the_form \
  tests/unit/triggers/test_triggers.py \
  tests/unit/hooks/test_hook_config.py \
  tests/integration/test_airflow_versions.py \
  tests/integration/test_dags.py \
  tests/integration/core/jobs/test_tries.py \
  tests/integration/operators/test_operator_lifecycle.py \
  tests/integration/operators/test_map_dags.py::test_map_retry_recovers_transient_failures \
  tests/integration/operators/test_map_dags.py::test_map_fail_fast_cancels_the_rest \
  "tests/integration/test_standalone.py::test_clearing_a_deferred_task_runs_one_new_job" \
  "tests/integration/test_standalone.py::test_a_deferred_task_ends_in_its_trigger_when_nothing_follows_its_job" \
  tests/unit/triggers/test_trigger_end_task.py \
  tests/unit/operators/test_asset_uris.py \
  tests/unit/operators/test_xcoms.py \
  tests/unit/operators/test_trigger_queue.py \
  tests/integration/cli/test_cli.py::test_list_status_logs_result_and_cleanup \
  tests/integration/cli/test_cli_stdout.py \
  tests/integration/operators/test_result_edges.py \
  tests/integration/plugins/test_kinetic_plugin.py \
  "tests/integration/core/jobs/test_history.py::test_every_path_leaves_what_the_policy_says_and_the_history_shows_it[on_success]" \
  tests/integration/core/jobs/test_history.py::test_cleanup_keeps_what_xcoms_need_then_applies_the_retention \
  tests/integration/faults/test_faults_keys.py \
  tests/unit/operators/test_capacity_options.py \
  tests/integration/operators/test_capacity_fallback.py \
  tests/integration/runner/test_checkpoint_resume.py \
  tests/integration/test_sweep_standalone.py \
  tests/integration/plugins/test_kinetic_task_tab.py \
  tests/integration/operators/test_assets.py \
  tests/integration/operators/test_openlineage.py \
  tests/unit/core/test_metrics.py \
  tests/integration/triggers/test_deferral_settle.py \
  tests/unit/core/jobs/test_polling.py \
  tests/unit/operators/test_keyio_unit.py \
  tests/integration/operators/test_keyio_gke.py \
  tests/integration/core/keys/peer/test_peers_jobs.py \
  tests/integration/core/keys/tensors/test_tensor_keys_gke.py \
  tests/integration/core/keys/peer/test_peer_keys_ls_ttl.py \
  tests/integration/operators/test_retry_policy.py \
  "$@"
