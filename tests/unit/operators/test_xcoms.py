"""operators.xcoms: a large value is a reference with Airflow's own XCom backend and the
value itself where the deployment's backend stores large values (issue 42)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.jobs.resultref import is_result_ref
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.operators.xcoms import offloaded, xcom_value

BIG = "x" * 3_000_000  # 3 MB: over [kinetic] max_xcom_result_bytes (1 MiB)
OBJECT_STORAGE = "airflow.providers.common.io.xcom.backend.XComObjectStorageBackend"


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(str(tmp_path / "store"))


def _value(store: LocalStore, value: object) -> object:
    return xcom_value(value, store, "job-00000001", b"blob", logging.getLogger("t"))


@pytest.mark.parametrize(
    "backend, itself",
    [
        ("", False),
        ("airflow.sdk.execution_time.xcom.BaseXCom", False),
        ("tests.fixtures.xcom_backends.KeepsInDatabase", False),
        ("tests.fixtures.xcom_backends.DeclaresOffload", True),
        (OBJECT_STORAGE, True),
    ],
)
def test_a_large_value_goes_itself_only_where_the_backend_offloads(
    store, monkeypatch, tmp_path, backend, itself
):
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", backend)
    monkeypatch.setenv("AIRFLOW__COMMON_IO__XCOM_OBJECTSTORAGE_PATH", f"file://{tmp_path}/xcoms")
    monkeypatch.setenv("AIRFLOW__COMMON_IO__XCOM_OBJECTSTORAGE_THRESHOLD", "1000")
    assert offloaded() is itself
    value = _value(store, BIG)
    if itself:
        assert value == BIG
    else:
        assert is_result_ref(value) and value["bytes"] == len(b"blob")
    assert not (tmp_path / "xcoms").exists()  # checking it uploaded nothing
    assert _value(store, {"small": 1}) == {"small": 1}  # small values: always themselves
