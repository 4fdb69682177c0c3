"""The deployment secret that per-job result keys derive from (Airflow layer).

It must be the same on every worker and triggerer of a deployment and must never
enter the object store.  In order: ``[kinetic] result_signing_key``; else Airflow's
``[core] fernet_key`` (already shared by every component of a deployment); else a
random key kept in ``$AIRFLOW_HOME/kinetic/.result-signing-key`` (0600), enough for
one machine (the embedded local backend, ``airflow standalone``).
"""

from __future__ import annotations

import hashlib
import os
import secrets

from airflow.providers.common.compat.sdk import conf

from airflow_provider_kinetic.core.jobs.signing import AUTH_NONE, job_key
from airflow_provider_kinetic.core.spec.handles import JobHandle

KEY_FILE = ".result-signing-key"


def _home() -> str:
    return (
        os.environ.get("AIRFLOW_HOME")
        or conf.get("core", "airflow_home", fallback="")
        or (os.path.expanduser("~/airflow"))
    )


def deployment_secret() -> bytes:
    """The secret every job's result key derives from (see module docstring)."""
    configured = conf.get("kinetic", "result_signing_key", fallback="") or conf.get(
        "core", "fernet_key", fallback=""
    )
    if configured:
        return hashlib.sha256(b"kinetic-result-signing:" + configured.encode()).digest()
    path = os.path.join(_home(), "kinetic", KEY_FILE)
    try:
        with open(path, "rb") as f:
            return bytes.fromhex(f.read().decode().strip())
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    key = secrets.token_hex(32)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    try:
        os.link(tmp, path)  # first writer wins; a concurrent one reads the winner's key
    except FileExistsError:
        pass
    finally:
        os.remove(tmp)
    with open(path, "rb") as f:
        return bytes.fromhex(f.read().decode().strip())


def result_key(handle: JobHandle) -> str | None:
    """The key a job's result must be signed with; ``None`` for unsigned (kinetic-runner) jobs."""
    if handle.result_auth == AUTH_NONE:
        return None
    return job_key(deployment_secret(), handle.job_id)


def result_key_for_job(job_id: str, result_auth: str) -> str | None:
    return None if result_auth == AUTH_NONE else job_key(deployment_secret(), job_id)
