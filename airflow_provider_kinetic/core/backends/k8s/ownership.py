"""What proves that a Kubernetes object of a job's name is that job's own.

Names are predictable (``kinetic-{job_id}``, ``keras-pathways-{job_id}``), and so are
the labels built from a spec (``app``, ``job-id``, the Airflow identity): anyone who
can create Jobs in the namespace can make an object that carries them.  So an object
is taken as ours only when

* it carries the labels that were sent with the create (or, for a handle, its
  ``job-id``), and
* when the backend has the deployment's secret (``GkeBackend.owner_secret``), its
  :data:`OWNER_LABEL` is :func:`owner_token` of the secret, the namespace and the name:
  an HMAC that only a holder of the deployment secret can compute, written at create.
  Any secret of a rotated keyring proves it; the newest one is written.

Objects found to be someone else's are never adopted, patched or deleted; deletes of
our own carry a ``preconditions.uid`` of the object that was proven, so an object
replaced in between is not deleted either (the API server answers 409 Conflict).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.backends.k8s.api import KubernetesApiError, Reply

#: Label with the owner token (:func:`owner_token`) on a job's Job/LWS and Secret.
OWNER_LABEL = "kinetic-owner"
_TOKEN_HEX = 32  # 128 bits: a label value holds at most 63 characters


def secrets_of(secret: bytes) -> tuple[bytes, ...]:
    """Every secret of ``secret`` (a ``core.jobs.signing.Keyring`` carries its ring in
    ``secrets``, newest first; plain bytes are a ring of one)."""
    return tuple(getattr(secret, "secrets", None) or (bytes(secret),))


def owner_token(secret: bytes, namespace: str, name: str) -> str:
    """The owner token of the object ``namespace/name``: HMAC-SHA256 of the deployment
    secret over the object's place (a token seen on one object proves nothing about
    another, and reveals nothing of the secret)."""
    msg = f"kinetic-k8s-owner:{namespace}/{name}".encode()
    return hmac.new(bytes(secret), msg, hashlib.sha256).hexdigest()[:_TOKEN_HEX]


def tokens_for(secret: bytes | None, namespace: str, name: str) -> tuple[str, ...]:
    """The tokens that prove ``namespace/name`` ours, newest secret first (none without
    a secret: the labels alone are then the proof)."""
    if secret is None:
        return ()
    return tuple(owner_token(s, namespace, name) for s in secrets_of(secret))


def labels_of(obj: Any) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def uid_of(obj: Any) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("uid") or None


@dataclass(frozen=True)
class Proof:
    """Whether an object was proven a job's own, and why not."""

    owned: bool
    #: What failed the proof ("" when owned).
    why: str = ""
    #: The object's uid (the delete precondition).
    uid: str | None = None
    #: The object's labels as found (named in a conflict).
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The object as read (``None``: there is none of that name).
    found: dict[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Ownership:
    """What an object named ``namespace/name`` must carry to be this job's."""

    kind: str
    namespace: str
    name: str
    #: Labels that must all be present with these values.
    labels: Mapping[str, str]
    #: One of these must be the object's :data:`OWNER_LABEL` (none: not asked).
    tokens: tuple[str, ...] = ()

    @property
    def strong(self) -> bool:
        """Whether the proof rests on the owner token, not on guessable labels alone."""
        return bool(self.tokens)

    def check(self, obj: dict[str, Any] | None) -> Proof:
        """Whether ``obj`` (as read; ``None``: not found) is this job's."""
        if obj is None:
            return Proof(False, "it does not exist")
        have = labels_of(obj)
        uid = uid_of(obj)
        wrong = sorted(k for k, v in self.labels.items() if k != OWNER_LABEL and have.get(k) != v)
        if wrong:
            why = f"its labels {', '.join(wrong)} are not this job's"
            return Proof(False, why, uid, have, obj)
        if self.tokens and have.get(OWNER_LABEL) not in self.tokens:
            why = f"its {OWNER_LABEL} label does not prove this deployment created it"
            return Proof(False, why, uid, have, obj)
        return Proof(True, "", uid, have, obj)

    def conflict(self, proof: Proof) -> OwnershipConflict:
        return OwnershipConflict(self, proof)


class OwnershipConflict(KubernetesApiError):
    """An object of the job's name exists and is not the job's: it is left as it is.

    A ``KubernetesApiError`` with status 409, as the API server's AlreadyExists."""

    def __init__(self, ownership: Ownership, proof: Proof):
        self.ownership = ownership
        self.found_labels = dict(proof.labels)
        shown = {k: v for k, v in proof.labels.items() if k != OWNER_LABEL}
        message = (
            f"{ownership.kind} {ownership.namespace}/{ownership.name} already exists and is "
            f"not this job's ({proof.why}; its labels: {json.dumps(shown, sort_keys=True)}); "
            "it was left as it is: another party owns that name"
        )
        body = json.dumps({"reason": "AlreadyExists", "message": message}).encode()
        super().__init__(
            f"creating {ownership.kind} {ownership.namespace}/{ownership.name}", Reply(409, body)
        )


def stamp(body: dict[str, Any], token: str | None) -> dict[str, Any]:
    """``body`` with the owner token among its labels (unchanged without one)."""
    if token:
        body["metadata"].setdefault("labels", {})[OWNER_LABEL] = token
    return body


def delete_options(uid: str | None) -> dict[str, Any]:
    """A ``DeleteOptions`` body (``V1DeleteOptions(preconditions=V1Preconditions(uid=...))``
    as JSON): the API server deletes only the object with this uid and answers 409
    Conflict if the name now holds another one (Kubernetes API reference,
    DeleteOptions.preconditions: "Must be fulfilled before a deletion is carried out")."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if uid:
        body["preconditions"] = {"uid": uid}
    return body
