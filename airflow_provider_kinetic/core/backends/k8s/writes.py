"""How a cluster backend creates and deletes a job's objects, each proven its own.

A mixin of :class:`~airflow_provider_kinetic.core.backends.k8s.gke.GkeBackend` (and so
of the LeaderWorkerSet backend, ``pathways.py``): the create of a job's object with its
Secret (stamped with the owner token, the Secret then owned by the object; a Secret of
the name that a restarted driver meets is adopted only when proven ours), settling a
create whose answer was lost or refused (read back by name, taken as created only when
proven ours, else a conflict left untouched), and the cancel that deletes only an
object proven the job's own, by uid precondition.  What proves ownership is
``k8s/ownership.py``'s; the read of the object is the backend's ``_owner_plan``
(``k8s/reads.py``), and ``_delete_plan`` the hook a kind of object overrides.  Plans
only: no client, no I/O (``k8s/api.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_kinetic.core.backends.k8s.api import (
    Call,
    KubernetesApiError,
    Plan,
    Reply,
    json_or_none,
)
from airflow_provider_kinetic.core.backends.k8s.manifests import owner_reference, secret_manifest
from airflow_provider_kinetic.core.backends.k8s.ownership import (
    OWNER_LABEL,
    Ownership,
    Proof,
    delete_options,
    stamp,
    tokens_for,
    uid_of,
)
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.spec.pod import JobSpec, secret_name

log = logging.getLogger(__name__)


class OwnedWrites:
    """The create and cancel plans of a cluster backend (mixed into ``GkeBackend``);
    needs ``owner_secret``, ``owned_kind``, ``where(handle)`` and ``_owner_plan`` from it."""

    owner_secret: bytes | None
    owned_kind: str
    where: Any  # (handle) -> (namespace, object name), the backend's
    _owner_plan: Any  # (namespace, name) -> Plan of the object or None, the backend's

    # ---- ownership (k8s/ownership.py) -------------------------------------------
    def _stamped(self, body: dict[str, Any]) -> dict[str, Any]:
        """A create's body with the owner token of the newest deployment secret."""
        meta = body["metadata"]
        tokens = tokens_for(self.owner_secret, meta["namespace"], meta["name"])
        return stamp(body, tokens[0] if tokens else None)

    def _ownership_of(self, kind: str, body: dict[str, Any]) -> Ownership:
        """What the object a create sends must carry when it is found: every label sent."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != OWNER_LABEL}
        return Ownership(kind, ns, name, labels, tokens_for(self.owner_secret, ns, name))

    def _handle_ownership(self, handle: JobHandle) -> Ownership:
        """What a handle's object must carry to be its job's: its ``job-id`` label and,
        with the deployment secret, the owner token.  (Not ``app``: a task's extra
        labels may replace it, ``core/spec/pod.py``.)"""
        ns, name = self.where(handle)
        labels = {"job-id": handle.job_id}
        return Ownership(self.owned_kind, ns, name, labels, tokens_for(self.owner_secret, ns, name))

    def _owned_plan(self, ownership: Ownership) -> Plan[Proof]:
        """Whether the object of ``ownership``'s name is ours (``Proof.found``: as read)."""
        found = yield from self._owner_plan(ownership.namespace, ownership.name)
        return ownership.check(found)

    # ---- create ------------------------------------------------------------------
    def _with_secrets(self, spec: JobSpec, create: Call, ownership: Ownership) -> Plan[None]:
        """Create the job's Secret, then the job (``create``), then make the job own the
        Secret (``ownerReferences``, the job's uid), so that Kubernetes deletes it with the job.

        A create whose answer was lost (connections dropped on every attempt, or a 5xx
        last) may have happened: the object is read back by name and taken as created
        when it is proven ours (``k8s/ownership.py``).  An object of the name that is not
        ours is a conflict, raised naming it, and left untouched.  The Secret is deleted
        (by uid) only when the job is known not to exist; while that cannot be told it is
        kept, since a job that was created needs it to start.
        """
        what = f"{ownership.kind} {ownership.namespace}/{ownership.name}"
        secret = secret_manifest(spec)
        secret_uid: str | None = None
        if secret is not None:
            secret = stamp(secret, ownership.tokens[0] if ownership.tokens else None)
            reply = yield Call("CoreV1Api", "create_namespaced_secret", (spec.namespace, secret))
            if reply.status == 409:  # e.g. a driver that made it and died: proven ours?
                found = yield from self._adopted_secret(secret, ownership, reply)
                secret_uid = uid_of(found)
            elif not reply.ok:
                raise KubernetesApiError(f"creating the Secret of {what}", reply)
            else:
                secret_uid = uid_of(reply.json())
        lost: Exception | None = None
        try:
            reply = yield create
        except Exception as exc:  # noqa: BLE001 - every attempt lost its answer: read back
            lost, reply = exc, Reply(0, b"")
        if reply.ok:
            created = reply.json() or {}
        else:
            created = yield from self._settle(spec, ownership, reply, lost, secret_uid)
        if secret is not None and uid_of(created):
            patch = {"metadata": {"ownerReferences": [owner_reference(created)]}}
            name = secret["metadata"]["name"]
            reply = yield Call(
                "CoreV1Api", "patch_namespaced_secret", (name, spec.namespace, patch)
            )
            if not reply.ok:
                log.warning("could not make %s own its Secret: HTTP %s", what, reply.status)

    def _adopted_secret(
        self, secret: dict[str, Any], ownership: Ownership, conflict: Reply
    ) -> Plan[dict[str, Any]]:
        """The Secret of the job's name that a create met (409), read back and adopted
        when proven ours: every label sent, the owner token (the deployment secret's,
        so without one nothing proves it), and no owner but the job's own object (a
        driver that died after making the job and its ``ownerReferences`` patch).
        Anything else raises :class:`OwnershipConflict` naming it, and it is not touched."""
        meta = secret["metadata"]
        ns, name = meta["namespace"], meta["name"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != OWNER_LABEL}
        mine = Ownership("Secret", ns, name, labels, ownership.tokens)
        reply = yield Call("CoreV1Api", "read_namespaced_secret", (name, ns))
        found = json_or_none(reply, f"reading Secret {ns}/{name}")
        if found is None:  # gone since the 409 (its owner's garbage collection): try again
            raise KubernetesApiError(f"creating Secret {ns}/{name}", conflict)
        proof = mine.check(found)
        if proof.owned and not mine.strong:
            proof = Proof(False, "no owner token can prove whose it is", proof.uid, proof.labels)
        others = [
            f"{ref.get('kind')} {ref.get('name')}"
            for ref in (found.get("metadata") or {}).get("ownerReferences") or []
            if (ref.get("kind"), ref.get("name")) != (ownership.kind, ownership.name)
        ]
        if proof.owned and others:
            why = f"it is owned by {', '.join(others)}, not by {ownership.kind} {ownership.name}"
            proof = Proof(False, why, proof.uid, proof.labels)
        if not proof.owned:
            raise mine.conflict(proof)
        log.info("Secret %s/%s exists (an earlier submit made it); proven ours: adopted", ns, name)
        return found

    def _settle(
        self,
        spec: JobSpec,
        ownership: Ownership,
        reply: Reply,
        lost: Exception | None,
        secret_uid: str | None,
    ) -> Plan[dict[str, Any]]:
        """A create that did not answer 2xx: the object it made (proven ours), else raise.

        A 409 is someone else's object unless the owner token proves it ours (without a
        deployment secret the labels alone cannot tell, and the retry already adopted
        what a lost attempt of this create made, ``k8s/create.py``).  Other 4xx answers
        mean the create did not happen.  A lost answer or a 5xx may have created it.
        """
        what = f"{ownership.kind} {ownership.namespace}/{ownership.name}"
        error = lost or KubernetesApiError(f"creating {what}", reply)
        maybe = lost is not None or reply.status >= 500 or reply.status == 429
        if not maybe and reply.status != 409:  # refused (400/403/422): nothing was made
            yield from self._delete_secret(spec, secret_uid)
            raise error
        try:
            proof = yield from self._owned_plan(ownership)
        except Exception as exc:  # noqa: BLE001 - cannot tell: keep the Secret
            log.warning(
                "%s: the create's answer was lost and the read-back failed (%s); keeping its "
                "Secret, which the job needs if it was created",
                what,
                exc,
            )
            raise error from exc
        if proof.found is None:  # the job does not exist: its Secret goes
            yield from self._delete_secret(spec, secret_uid)
            raise error
        if proof.owned and (maybe or ownership.strong):
            log.info("%s exists after its create lost its answer; taking it as created", what)
            return proof.found
        # Someone else's object: it is not touched.  Our own Secret (proven by the uid
        # our create answered) would only feed it our secrets: it goes.
        yield from self._delete_secret(spec, secret_uid)
        if proof.owned:  # labels match, no token to prove it: the name is taken all the same
            proof = Proof(False, "no owner token can prove whose it is", proof.uid, proof.labels)
        raise ownership.conflict(proof) from lost

    def _delete_secret(self, spec: JobSpec, uid: str | None) -> Plan[None]:
        """Delete the Secret this submit created (``uid`` from its create's answer): by
        uid precondition, so a Secret of that name made by anyone else stays."""
        if not spec.secrets:
            return
        if uid is None:
            log.warning("the Secret of job %s has no uid in its create answer: kept", spec.job_id)
            return
        name = secret_name(spec.job_id)
        reply = yield Call(
            "CoreV1Api",
            "delete_namespaced_secret",
            (name, spec.namespace),
            {"body": delete_options(uid)},
        )
        if not reply.ok and reply.status != 404:
            log.warning("could not delete the Secret of job %s: HTTP %s", spec.job_id, reply.status)

    # ---- cancel -----------------------------------------------------------------
    def _cancel_plan(self, handle: JobHandle) -> Plan[None]:
        """Delete the handle's object, only when it is proven the job's own, and only
        that object (uid precondition: one replaced since the read stays)."""
        ownership = self._handle_ownership(handle)
        proof = yield from self._owned_plan(ownership)
        what = f"{ownership.kind} {ownership.namespace}/{ownership.name}"
        if proof.found is None:
            return
        if not proof.owned:
            log.warning(
                "not deleting %s: it is not job %s's (%s; its labels: %s)",
                what,
                handle.job_id,
                proof.why,
                dict(proof.labels),
            )
            return
        reply = yield from self._delete_plan(ownership, proof.uid)
        if reply.status == 409:  # the precondition failed: the name holds another object now
            log.warning("not deleting %s: it was replaced since it was read", what)
            return
        if not reply.ok and reply.status != 404:
            raise KubernetesApiError(f"deleting {what}", reply)

    def _delete_plan(self, ownership: Ownership, uid: str | None) -> Plan[Reply]:
        """Delete the job's object (foreground: its pods go first) if it still has ``uid``."""
        return (
            yield Call(
                "BatchV1Api",
                "delete_namespaced_job",
                (ownership.name, ownership.namespace),
                {"body": delete_options(uid), "propagation_policy": "Foreground"},
            )
        )
