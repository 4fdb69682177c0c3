"""Connection checks: does the store work, does the cluster answer?

``KineticHook.test_connection`` (the UI's *Test* button, and ``airflow connections
test``) runs these.  Each check raises :class:`KineticConfigError` saying which step
failed, and returns what it verified otherwise.  The Kubernetes modules are imported
only when the target has a cluster to check.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.config import KineticConfig, KineticConfigError
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.backends import cluster_client_factory


def probe_store(store: ObjectStore) -> str:
    """Write, read and delete one object under a fresh prefix; raise on any mismatch."""
    token = secrets.token_hex(8)
    prefix = f"_kinetic-connection-test-{token}/"
    key = prefix + "probe"
    data = f"kinetic connection test {token}\n".encode()
    step = "writing a probe object"
    try:
        store.write_bytes(key, data, if_absent=True)
        try:
            step = "reading the probe object back"
            back = store.read_bytes(key)
        finally:
            step = "deleting the probe object"
            store.delete_prefix(prefix)
    except Exception as exc:
        raise KineticConfigError(
            f"store {store.uri()}: {step} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if back != data:
        raise KineticConfigError(f"store {store.uri()} returned other bytes than were written")
    if store.exists(key):
        raise KineticConfigError(f"store {store.uri()} did not delete {key!r}")
    return f"store {store.uri()} works (probe object written, read back and deleted)"


def probe_cluster(config: KineticConfig) -> list[str]:
    """Check the cluster of a cluster backend; ``[]`` when the target needs none."""
    kinds = (
        [cls.name for cls in registry.auto_candidates()]
        if config.backend == registry.AUTO
        else [config.backend]
    )
    classes = [registry.backend_class(kind) for kind in kinds]
    if not any(cls.needs_cluster for cls in classes):
        return []
    from airflow_provider_kinetic.core.backends.k8s import retry as k8s_retry
    from airflow_provider_kinetic.core.backends.k8s.api import Call
    from airflow_provider_kinetic.core.backends.k8s.manifests import JOBSET_GROUP, LWS_GROUP
    from airflow_provider_kinetic.core.backends.k8s.pathways import PathwaysBackend

    factory = cluster_client_factory(config, kinds[0])
    host = factory.endpoint.host if hasattr(factory, "endpoint") else "the cluster"
    client = factory()
    done = []
    try:

        def get(what: str, call: Call) -> Any:
            try:
                answer = k8s_retry.call_sync(client, call)
            except Exception as exc:  # noqa: BLE001 - transport errors of either client
                raise KineticConfigError(
                    f"{what}: the API server {host} did not answer: {exc}"
                ) from exc
            if answer.status == 404:
                return None
            if not answer.ok:
                detail = answer.body[:200].decode("utf-8", "replace")
                raise KineticConfigError(f"{what}: HTTP {answer.status} from {host}: {detail}")
            return json.loads(answer.body or b"null")

        version = get("reading the cluster version", Call("VersionApi", "get_code")) or {}
        done.append(f"cluster {config.cluster} ({host}) answers, {version.get('gitVersion', '?')}")
        ns = config.namespace
        if get(f"reading namespace {ns!r}", Call("CoreV1Api", "read_namespace", (ns,))) is None:
            raise KineticConfigError(
                f"namespace {ns!r} does not exist in cluster {config.cluster}: create it "
                "(kubectl create namespace) or set the 'namespace' extra"
            )
        done.append(f"namespace {ns!r} exists")
        # The custom APIs a backend of this target needs: (group, name, backend, what
        # cannot run without it, where to install it from).
        needs = []
        if any(issubclass(cls, PathwaysBackend) for cls in classes):
            lws = "https://lws.sigs.k8s.io/docs/installation/"
            needs.append((LWS_GROUP, "LeaderWorkerSet", "pathways", "multi-host jobs", lws))
        if config.backend == registry.AUTO or any(cls.runs_slices for cls in classes):
            jobset = "https://jobset.sigs.k8s.io/docs/installation/"
            needs.append((JOBSET_GROUP, "JobSet", "jobset", "multi-slice jobs", jobset))
        if needs:
            groups = (get("listing API groups", Call("ApisApi", "get_api_versions")) or {}).get(
                "groups"
            ) or []
            names = {g.get("name") for g in groups}
        for group, api, backend, jobs, install in needs:
            if group in names:
                done.append(f"the {api} API ({group}) is installed")
            elif config.backend == registry.AUTO:
                done.append(f"the {api} API ({group}) is not installed: {jobs} cannot run")
            else:
                raise KineticConfigError(
                    f"the {api} API ({group}) is not installed in cluster "
                    f"{config.cluster}: the {backend} backend needs it (install {api}, "
                    f"{install})"
                )
    finally:
        client.close()
    return done
