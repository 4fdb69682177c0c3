"""Authenticated results and records: HMAC-SHA256 under per-job keys.

The object store is shared with whoever can write the bucket, so nothing read back
from it is unpickled on a worker unless it is authenticated.  Each job gets its own
key, derived from a deployment secret that never enters the store (see
``hooks/signing.py``); the job receives only its own key, as a secret (a Kubernetes
Secret on GKE, a 0600 file on the local backend).  The runner signs ``result.pkl``
(and worker failure payloads) and writes the signature *before* the payload, so a
reader that sees a result can always see its signature.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError

#: Env var through which a job's runner receives its own result key (hex).
RESULT_KEY_ENV = "KINETIC_RESULT_KEY"
#: ``JobHandle.result_auth`` values.
AUTH_HMAC = "hmac-sha256"
AUTH_NONE = "none"


class ResultAuthError(KineticError, ValueError):
    """A result (or record) read from the store is unsigned, truncated or substituted."""


def job_key(secret: bytes, job_id: str) -> str:
    """The per-job key (hex): what the job receives and what verifies its result."""
    return hmac.new(secret, b"kinetic-result:" + job_id.encode(), hashlib.sha256).hexdigest()


def sign(key_hex: str, blob: bytes) -> str:
    return hmac.new(bytes.fromhex(key_hex), blob, hashlib.sha256).hexdigest()


def signature_key(object_key: str) -> str:
    """Where the signature of ``object_key`` lives: ``{object_key}.sig``."""
    return object_key + ".sig"


def verify(key_hex: str, blob: bytes, signature: bytes | str | None, what: str) -> None:
    """Raise ``ResultAuthError`` naming ``what`` unless ``signature`` is ``blob``'s."""
    if signature is None:
        raise ResultAuthError(f"{what} is not signed: refusing to unpickle it")
    text = signature.decode("ascii", "replace") if isinstance(signature, bytes) else signature
    if not hmac.compare_digest(text.strip(), sign(key_hex, blob)):
        raise ResultAuthError(
            f"{what} does not match its signature (substituted, truncated or corrupted): "
            "refusing to unpickle it"
        )


def _fernet(secret: bytes) -> Any:
    import base64

    from cryptography.fernet import Fernet  # worker side only; the runner never needs it

    key = hashlib.sha256(b"kinetic-secret-env:" + secret).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def encrypt_env(secret: bytes, env: dict[str, str]) -> str:
    """Captured env values, encrypted for a batch's state (which travels through the
    trigger table): only a worker holding the deployment secret can read them."""
    return _fernet(secret).encrypt(json.dumps(env).encode()).decode()


def decrypt_env(secret: bytes, token: str) -> dict[str, str]:
    return json.loads(_fernet(secret).decrypt(token.encode()))


def seal(secret: bytes, record: dict[str, Any]) -> bytes:
    """JSON bytes of ``record`` with an HMAC over its canonical form (store records)."""
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    mac = hmac.new(secret, b"kinetic-record:" + body.encode(), hashlib.sha256).hexdigest()
    return json.dumps({"record": record, "mac": mac}, sort_keys=True).encode()


def unseal(secret: bytes, blob: bytes, what: str) -> dict[str, Any]:
    """The record sealed by ``seal``; ``ResultAuthError`` if it was tampered with."""
    try:
        outer = json.loads(blob)
        record, mac = outer["record"], outer["mac"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ResultAuthError(f"{what} is not a sealed kinetic record") from exc
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    good = hmac.new(secret, b"kinetic-record:" + body.encode(), hashlib.sha256).hexdigest()
    if not isinstance(mac, str) or not hmac.compare_digest(mac, good):
        raise ResultAuthError(f"{what} does not match its seal: ignoring it")
    return record
