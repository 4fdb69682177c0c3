"""Trust boundaries (issue 38, case 3): the verifier decides from its own keyring.

A handle (an XCom dict, a rendered template) that says ``result_auth: "none"`` must not
turn verification off.  With a signing secret configured (the suite configures
``[kinetic] result_signing_key``), an unsigned or wrongly signed result an attacker
wrote to the store is refused naming the job, by ``attach(dict)`` and by
``KineticJobSensor``, and nothing is unpickled; the genuine, signed result still reads.
Only a deployment with no signing secret at all believes the handle (kinetic 0.0.4's
runner signs nothing)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from airflow_provider_kinetic import KineticJobSensor, KineticRunOperator, attach
from airflow_provider_kinetic.core.jobs.signing import ResultAuthError, job_key, sign
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import result_key, signing_configured
from airflow_provider_kinetic.exceptions import KineticJobFailed
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.local_conn import set_local_conn

CONN = "kn_downgrade"


def double(x: int) -> int:
    return 2 * x


class Boom:
    """Unpickling this runs ``open(marker, "w")``: the side effect must never happen."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def conn(monkeypatch, tmp_path) -> str:
    set_local_conn(monkeypatch, tmp_path / "kinetic", CONN)
    return CONN


def sensor(handle: dict) -> KineticJobSensor:
    return KineticJobSensor(
        task_id="wait", handle=handle, kinetic_conn_id=CONN, return_result=True, cleanup="never"
    )


def test_a_handle_saying_unsigned_does_not_turn_verification_off(conn, tmp_path: Path) -> None:
    assert signing_configured()  # the suite's deployment has a secret
    op = KineticRunOperator(task_id="t", python_callable=double, op_args=[21],
                            kinetic_conn_id=conn, wait_for_completion=False)  # fmt: skip
    handle = op.execute({"ti": FakeTI()})
    job_id = handle["job_id"]
    # The normal, signed path: the handle as the operator pushed it.
    assert handle["result_auth"] == "hmac-sha256"
    assert attach(handle, conn_id=conn).result(timeout=120, poll_interval=0.05) == 42
    assert sensor(handle).poke({}).xcom_value == 42

    store = LocalStore(str(tmp_path / "kinetic"))
    target, marker = f"{job_id}/result.pkl", tmp_path / "side-effect"
    forged = pickle.dumps(Boom(str(marker)))
    downgraded = {**handle, "result_auth": "none"}
    attacks = {
        "unsigned": None,
        "wrongly signed": sign(job_key(b"attacker" * 4, job_id), forged),
    }
    for attack, signature in attacks.items():
        store.write_bytes(target, forged)
        if signature is None:
            store.delete(target + ".sig")
        else:
            store.write_bytes(target + ".sig", signature.encode())
        with pytest.raises(ResultAuthError, match=job_id) as info:
            attach(downgraded, conn_id=conn).result(timeout=120, poll_interval=0.05)
        assert ("not signed" in str(info.value)) is (signature is None), attack
        with pytest.raises(KineticJobFailed, match=job_id) as failed:
            sensor(downgraded).poke({})
        assert isinstance(failed.value.__cause__, ResultAuthError), attack
        assert not marker.exists(), attack  # nothing was unpickled


def test_only_a_deployment_without_a_secret_believes_an_unsigned_handle(
    monkeypatch, tmp_path: Path
) -> None:
    """kinetic 0.0.4 interop: no secret configured and none generated, so nothing can
    be verified; the moment a secret is configured the same handle gets a key."""
    unsigned = JobHandle.from_dict(
        {"job_id": "job-0000abcd", "backend": "local", "bucket_name": "b", "result_auth": "none"}
    )
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))  # no generated key file here
    for option in ("RESULT_SIGNING_KEYS", "RESULT_SIGNING_KEY"):
        monkeypatch.setenv(f"AIRFLOW__KINETIC__{option}", "")
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "")
    assert not signing_configured()
    assert result_key(unsigned) is None
    monkeypatch.setenv("AIRFLOW__KINETIC__RESULT_SIGNING_KEY", "a-secret")
    assert signing_configured()
    assert result_key(unsigned) is not None
    assert not (tmp_path / "kinetic").exists()  # deciding generated no key
