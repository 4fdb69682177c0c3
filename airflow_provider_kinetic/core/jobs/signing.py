"""Authenticated results and records: HMAC-SHA256 under per-job keys.

The object store is shared with whoever can write the bucket, so nothing read back
from it is unpickled on a worker unless it is authenticated.  Each job gets its own
key, derived from a deployment secret that never enters the store (see
``deployment/signing.py``); the job receives only its own key, as a secret (a Kubernetes
Secret on GKE, a 0600 file on the local backend).  The runner signs ``result.pkl``
(and worker failure payloads) and writes the signature *after* the payload, each
atomically, so a crash never leaves a signature without its data (a reader that finds
the data first waits a moment for its signature).

Deployment secrets rotate: a :class:`Keyring` holds them, newest first.  The newest
seals and derives new jobs' keys; every one of them verifies.  Each secret has a key
id (:func:`key_id`, a short non-secret fingerprint) that seals carry and handles keep
(``result_key_id``), so a record or result sealed with a secret that has left the
ring fails with :class:`SigningKeyChanged` naming the key that sealed it, instead of
looking forged (which made a retry ignore its record and run the job again).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError

#: Env var through which a job's runner receives its own result key (hex).
RESULT_KEY_ENV = "KINETIC_RESULT_KEY"
#: ``JobHandle.result_auth`` values.
AUTH_HMAC = "hmac-sha256"
AUTH_NONE = "none"


class ResultAuthError(KineticError, ValueError):
    """A result (or record) read from the store is unsigned, truncated or substituted."""


class SigningKeyChanged(ResultAuthError):
    """A result or record sealed with a signing key that is no longer in the keyring."""


def key_id(secret: bytes) -> str:
    """A short, non-secret fingerprint of a deployment secret (8 hex digits)."""
    return hashlib.sha256(b"kinetic-key-id:" + bytes(secret)).hexdigest()[:8]


class Keyring(bytes):
    """The deployment's signing secrets, newest first.

    Its bytes are the newest secret, so every place that seals or derives a job key
    with "the deployment secret" uses the newest one unchanged; ``secrets`` holds them
    all, and every check here accepts any of them.  A plain ``bytes`` secret is a ring
    of one (:func:`ring_of`).  ``repr`` shows key ids only, never a secret.
    """

    secrets: tuple[bytes, ...]

    def __new__(cls, secrets: Sequence[bytes]) -> Keyring:
        if not secrets:
            raise ValueError("a keyring needs at least one secret")
        ring = super().__new__(cls, bytes(secrets[0]))
        ring.secrets = tuple(dict.fromkeys(bytes(s) for s in secrets))  # no duplicates
        return ring

    def __repr__(self) -> str:
        return f"Keyring({', '.join(key_id(s) for s in self.secrets)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Keyring, (list(self.secrets),))


def ring_of(secret: bytes) -> tuple[bytes, ...]:
    """Every secret of ``secret`` (a :class:`Keyring`, or a single secret)."""
    return getattr(secret, "secrets", None) or (bytes(secret),)


_KEY_ID = re.compile(r"[0-9a-f]{8}")


def key_changed(what: str, sealed_by: object, ids: str) -> ResultAuthError:
    """The error for a seal naming a key id this ring lacks: a key id that is no key
    id at all was altered (``ResultAuthError``); a well-formed one is a key that left
    the ring (``SigningKeyChanged``), unless the deployment never had it, which only
    its operator knows: the message says both."""
    if not isinstance(sealed_by, str) or not _KEY_ID.fullmatch(sealed_by):
        return ResultAuthError(
            f"{what} names signing key {sealed_by!r}, which is not a key id: it was "
            "altered (refusing to read it)"
        )
    return SigningKeyChanged(
        f"{what} was sealed with signing key {sealed_by}, which is not in this deployment's "
        f"keyring (keys {ids}): either the signing key changed since it was sealed (add "
        f"the secret whose key id is {sealed_by} to [kinetic] result_signing_keys, after "
        "the newest, to read it) or, if this deployment never had that key, the record "
        "was altered: do not add a key to read it"
    )


def _altered(what: str, claimed: str) -> ResultAuthError:
    return ResultAuthError(
        f"{what} claims signing key {claimed}, but it is sealed with another key of this "
        "deployment: its key id was altered (refusing to read it)"
    )


def job_key(secret: bytes, job_id: str) -> str:
    """The per-job key (hex): what the job receives and what verifies its result
    (derived from the newest secret of a :class:`Keyring`)."""
    return hmac.new(secret, b"kinetic-result:" + job_id.encode(), hashlib.sha256).hexdigest()


class ResultKey(str):
    """A job's result key (hex, derived from the newest secret), carrying the keys
    derived from every secret of the ring (``candidates``: key id -> key) and the id of
    the secret the job's key came from (``sealed_by``, from its handle; ``None`` for
    handles written before key ids).  It is a ``str``, so code that only passes a
    job's key along is unchanged; :func:`verify` reads the rest."""

    candidates: dict[str, str]
    sealed_by: str | None

    def __new__(
        cls, key: str, candidates: dict[str, str], sealed_by: str | None = None
    ) -> ResultKey:
        made = super().__new__(cls, key)
        made.candidates, made.sealed_by = dict(candidates), sealed_by
        return made

    @classmethod
    def for_job(cls, secret: bytes, job_id: str, sealed_by: str | None = None) -> ResultKey:
        """The keys of ``job_id`` under every secret of ``secret``'s ring."""
        ring = ring_of(secret)
        candidates = {key_id(s): job_key(s, job_id) for s in ring}
        return cls(job_key(ring[0], job_id), candidates, sealed_by)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ResultKey, (str(self), self.candidates, self.sealed_by))

    def __repr__(self) -> str:
        return f"ResultKey(keys {', '.join(self.candidates)}, sealed by {self.sealed_by})"


def sign(key_hex: str, blob: bytes) -> str:
    return hmac.new(bytes.fromhex(key_hex), blob, hashlib.sha256).hexdigest()


def signature_key(object_key: str) -> str:
    """Where the signature of ``object_key`` lives: ``{object_key}.sig``."""
    return object_key + ".sig"


def verify(key_hex: str, blob: bytes, signature: bytes | str | None, what: str) -> None:
    """Raise ``ResultAuthError`` naming ``what`` unless ``signature`` is ``blob``'s, under
    ``key_hex`` or, for a :class:`ResultKey`, the key of the secret that sealed the job
    (:class:`SigningKeyChanged` when that secret has left the ring), else any of its
    ring's keys."""
    if signature is None:
        raise ResultAuthError(f"{what} is not signed: refusing to unpickle it")
    text = signature.decode("ascii", "replace") if isinstance(signature, bytes) else signature
    ring: dict[str, str] | None = getattr(key_hex, "candidates", None)
    candidates = ring or {"": str(key_hex)}
    sealed_by = getattr(key_hex, "sealed_by", None)
    if ring and sealed_by is not None:
        if sealed_by not in ring:
            if _any_matches(text.strip(), (sign(k, blob) for k in ring.values())):
                raise _altered(what, sealed_by)
            raise key_changed(what, sealed_by, ", ".join(ring))
        candidates = {sealed_by: ring[sealed_by]}
    if not _any_matches(text.strip(), (sign(k, blob) for k in candidates.values())):
        hint = ""
        if ring:
            hint = f" (checked with signing keys {', '.join(candidates)})"
        raise ResultAuthError(
            f"{what} does not match its signature (substituted, truncated or corrupted): "
            f"refusing to unpickle it{hint}"
        )


def _any_matches(text: str, goods: Iterable[str]) -> bool:
    return any([hmac.compare_digest(text, good) for good in goods])  # noqa: C419 - all, in constant time


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
    """The env ``encrypt_env`` sealed, under any secret of the ring."""
    from cryptography.fernet import MultiFernet

    return json.loads(MultiFernet([_fernet(s) for s in ring_of(secret)]).decrypt(token.encode()))


def _record_mac(secret: bytes, body: str) -> str:
    return hmac.new(secret, b"kinetic-record:" + body.encode(), hashlib.sha256).hexdigest()


def seal(secret: bytes, record: dict[str, Any]) -> bytes:
    """JSON bytes of ``record`` with an HMAC over its canonical form (store records),
    under the newest secret, whose key id the seal carries (``kid``; readers from
    before key ids ignore it)."""
    newest = ring_of(secret)[0]
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    outer = {"record": record, "mac": _record_mac(newest, body), "kid": key_id(newest)}
    return json.dumps(outer, sort_keys=True).encode()


def unseal(secret: bytes, blob: bytes, what: str) -> dict[str, Any]:
    """The record sealed by ``seal``, checked with the ring's secret its ``kid`` names
    (any of them for a seal without one).  ``SigningKeyChanged`` when that secret is no
    longer in the ring, ``ResultAuthError`` when the record was tampered with."""
    try:
        outer = json.loads(blob)
        record, mac = outer["record"], outer["mac"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ResultAuthError(f"{what} is not a sealed kinetic record") from exc
    ring = {key_id(s): s for s in ring_of(secret)}
    kid = outer.get("kid")
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    if kid is not None and kid not in ring:
        if isinstance(mac, str) and _any_matches(
            mac, (_record_mac(s, body) for s in ring.values())
        ):
            raise _altered(what, kid)
        raise key_changed(what, kid, ", ".join(ring))
    secrets = [ring[kid]] if isinstance(kid, str) else list(ring.values())
    goods = (_record_mac(s, body) for s in secrets)
    if not isinstance(mac, str) or not _any_matches(mac, goods):
        raise ResultAuthError(
            f"{what} does not match its seal (checked with signing keys {', '.join(ring)}): "
            "it was altered, or sealed by another deployment"
        )
    return record
