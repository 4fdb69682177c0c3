"""The deployment secrets that per-job result keys derive from (Airflow layer).

They must be the same on every worker and triggerer of a deployment and must never
enter the object store.  ``[kinetic] result_signing_keys`` is a keyring: secrets
separated by commas, newest first; the newest seals records and derives new jobs'
keys, all of them verify (rotate by putting the new secret first and dropping the old
one once no job or record sealed with it is still wanted).  Without it, one secret,
in order: ``[kinetic] result_signing_key``; else Airflow's ``[core] fernet_key``
(already shared by every component of a deployment); else a random key kept in
``$AIRFLOW_HOME/kinetic/.result-signing-key`` (0600), enough for one machine (the
embedded local backend, ``airflow standalone``).  A secret configured by text is the
same secret in either option, so ``result_signing_keys = <new>, <old
result_signing_key>`` rotates away from the single key.

Whether a result must be signed is decided here, from this deployment's own
configuration (:func:`signing_configured`), never from what a handle, an XCom or the
store says: a handle's ``result_auth: "none"`` is believed only by a deployment that
has no signing secret at all (kinetic 0.0.4's own runner signs nothing, and a
deployment without a key has nothing to verify with).  With a secret, every result is
verified under its keyring and an unsigned one is refused naming its job, whatever
the handle claims.
"""

from __future__ import annotations

import hashlib
import os
import secrets

from airflow.providers.common.compat.sdk import conf

from airflow_provider_kinetic.core.jobs.signing import AUTH_NONE, Keyring, ResultKey
from airflow_provider_kinetic.core.spec.handles import JobHandle

KEY_FILE = ".result-signing-key"


def _home() -> str:
    return (
        os.environ.get("AIRFLOW_HOME")
        or conf.get("core", "airflow_home", fallback="")
        or (os.path.expanduser("~/airflow"))
    )


def _derive(configured: str) -> bytes:
    return hashlib.sha256(b"kinetic-result-signing:" + configured.encode()).digest()


def deployment_secret() -> Keyring:
    """The keyring every job's result key derives from (see module docstring): its
    bytes are the newest secret, and every secret in it verifies."""
    ring = conf.get("kinetic", "result_signing_keys", fallback="") or ""
    entries = [part.strip() for part in ring.replace("\n", ",").split(",") if part.strip()]
    if entries:
        return Keyring([_derive(entry) for entry in entries])
    return Keyring([_single_secret()])


def signing_configured() -> bool:
    """Whether this deployment has a signing secret: one configured
    (``[kinetic] result_signing_keys``/``result_signing_key``, ``[core] fernet_key``)
    or the generated key file.  The one source of "must results be signed"."""
    for section, option in (
        ("kinetic", "result_signing_keys"),
        ("kinetic", "result_signing_key"),
        ("core", "fernet_key"),
    ):
        if (conf.get(section, option, fallback="") or "").strip(" ,\n"):
            return True
    return os.path.exists(os.path.join(_home(), "kinetic", KEY_FILE))


def _single_secret() -> bytes:
    configured = conf.get("kinetic", "result_signing_key", fallback="") or conf.get(
        "core", "fernet_key", fallback=""
    )
    if configured:
        return _derive(configured)
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


def _unsigned_allowed(result_auth: str) -> bool:
    """A result may go unverified only where the handle says it is unsigned *and* this
    deployment has no signing secret (kinetic 0.0.4 interop); the handle alone never
    turns verification off."""
    return result_auth == AUTH_NONE and not signing_configured()


def result_key(handle: JobHandle) -> str | None:
    """The key a job's result must be signed with (a ``ResultKey``: the keyring's keys for
    the job and the id of the secret its handle says it got); ``None`` (unverified)
    only for an unsigned job on a deployment with no signing secret.  With a secret,
    a handle saying ``result_auth: "none"`` still gets the key: its unsigned result
    is refused (``ResultAuthError`` naming the job)."""
    if _unsigned_allowed(handle.result_auth):
        return None
    return ResultKey.for_job(deployment_secret(), handle.job_id, handle.result_key_id)


def result_key_for_job(job_id: str, result_auth: str) -> str | None:
    """``result_key`` when only the job id is known (batch children): any key of the ring."""
    if _unsigned_allowed(result_auth):
        return None
    return ResultKey.for_job(deployment_secret(), job_id)
