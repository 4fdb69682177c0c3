"""Shared pytest fixtures; each family lives in ``tests/fixtures/`` and is re-exported here."""

from tests.fixtures import airflow_env

# Before any test module imports Airflow: it reads its configuration once.
airflow_env.configure()
_TEMP_BEFORE = airflow_env.kinetic_temp_entries()

from tests.fixtures.airflow_env import airflow_home, load_dag  # noqa: E402
from tests.fixtures.fake_gcs import fake_gcs, gcs_bucket  # noqa: E402
from tests.fixtures.hf_hub_double import hf_hub  # noqa: E402

__all__ = ["airflow_home", "fake_gcs", "gcs_bucket", "hf_hub", "load_dag"]


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
