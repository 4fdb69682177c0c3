"""Shared pytest fixtures; each family lives in ``tests/fixtures/`` and is re-exported here."""

from tests.fixtures import airflow_env

# Before any test module imports Airflow: it reads its configuration once.
airflow_env.configure()
_TEMP_BEFORE = airflow_env.kinetic_temp_entries()

from tests.fixtures.airflow_env import airflow_home, load_dag  # noqa: E402
from tests.fixtures.fake_gcs import fake_gcs, gcs_bucket  # noqa: E402
from tests.fixtures.hf_hub_double import hf_hub  # noqa: E402
from tests.fixtures.k8s_double import _api_on_loop, api  # noqa: E402
from tests.fixtures.local_conn import local_conn  # noqa: E402

__all__ = [
    "_api_on_loop",
    "airflow_home",
    "api",
    "fake_gcs",
    "gcs_bucket",
    "hf_hub",
    "load_dag",
    "local_conn",
]


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "k8s_api(threaded=False, namespaces=()): the flavour of the api fixture "
        "(tests/fixtures/k8s_double.py)",
    )


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ARG001 - pytest's signature
    """Remove the session's throwaway AIRFLOW_HOME and temp dir, and fail the session if jobs left
    work dirs or mount-link state in the temp dir: tests leave nothing behind."""
    airflow_env.remove_home()
    left = sorted(airflow_env.kinetic_temp_entries() - _TEMP_BEFORE)
    airflow_env.remove_temp_dir()
    if left:
        session.config.get_terminal_writer().line(
            f"left behind in the temp dir: {', '.join(left[:10])}", red=True
        )
        session.exitstatus = 1


#: The costliest modules (docs/TESTING.md's table), started first: the workers take
#: modules in collection order (``--dist loadfile``), and a slow module taken last keeps
#: one worker busy while the other has nothing left.
SLOW_FIRST = (
    "tests/integration/plugins/test_browser.py",
    "tests/integration/test_benchmark_quick.py",
    "tests/integration/operators/test_openlineage.py",
    "tests/integration/test_standalone.py",
    "tests/integration/core/jobs/test_history.py",
    "tests/integration/test_airflow_versions.py",
    "tests/integration/test_assets_standalone.py",
    "tests/integration/test_hostile_ids_standalone.py",
    "tests/integration/test_sweep_standalone.py",
    "tests/integration/test_deployment_standalone.py",
    "tests/integration/operators/test_map_dags.py",
    "tests/integration/test_model_identity.py",
    "tests/integration/core/jobs/test_hostile_ids_and_clears.py",
    "tests/integration/core/jobs/test_tries.py",
    "tests/integration/cli/test_cli.py",
)


def pytest_collection_modifyitems(items) -> None:
    """Slow modules first (a stable sort: each module's own order stays)."""
    rank = {module: n for n, module in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


# Per-module cost, summed over every test's setup, call and teardown (on the xdist
# controller too: it receives every worker's reports).  Printed at the end of the run
# so a slow module shows itself; docs/TESTING.md keeps the table.
_MODULE_SECONDS: dict[str, float] = {}
_MODULE_TESTS: dict[str, int] = {}


def pytest_runtest_logreport(report) -> None:
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _MODULE_TESTS[module] = _MODULE_TESTS.get(module, 0) + 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _MODULE_SECONDS:
        return
    total = sum(_MODULE_SECONDS.values())
    ranked = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])
    terminalreporter.section("seconds per test module (setup + call + teardown)")
    for module, seconds in ranked[:30]:
        tests = _MODULE_TESTS.get(module, 0)
        terminalreporter.line(
            f"{seconds:8.1f} s {100 * seconds / total:5.1f}%  {tests:4d}  {module}"
        )
    terminalreporter.line(f"{total:8.1f} s in {len(ranked)} modules (summed over workers)")
