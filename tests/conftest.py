"""Shared pytest fixtures; each family lives in ``tests/fixtures/`` and is re-exported here."""

from tests.fixtures import airflow_env

# Before any test module imports Airflow: it reads its configuration once.
airflow_env.configure()

from tests.fixtures.airflow_env import airflow_home, load_dag  # noqa: E402
from tests.fixtures.fake_gcs import fake_gcs, gcs_bucket  # noqa: E402
from tests.fixtures.hf_hub_double import hf_hub  # noqa: E402

__all__ = ["airflow_home", "fake_gcs", "gcs_bucket", "hf_hub", "load_dag"]


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ARG001 - pytest's signature
    """Remove the session's throwaway AIRFLOW_HOME: tests leave nothing behind."""
    airflow_env.remove_home()
