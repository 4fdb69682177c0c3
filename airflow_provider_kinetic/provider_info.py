"""What Airflow's providers manager learns about this provider (no Airflow import).

Every operator, sensor, trigger, hook, link, the decorator, the ``kinetic``
connection type with its full form (a field per connection extra, with a label,
description, placeholder and type; a choice list for ``backend``), and the
``[kinetic]`` options with their defaults.
"""

from __future__ import annotations

from typing import Any

PACKAGE = "airflow_provider_kinetic"
INTEGRATION = "Kinetic"
#: Where the plugin mounts the Kinetic pages on the API server; operator links point
#: there.  Kept here (no Airflow import) so that neither needs the other.
PLUGIN_PREFIX = "/kinetic"


def _option(description: str, kind: str, default: str | None, sensitive: bool = False) -> dict:
    return {
        "description": description,
        "version_added": "0.1.0",
        "type": kind,
        "example": None,
        "default": default,
        "sensitive": sensitive,
    }


#: ``[kinetic]`` options (``airflow config list`` shows them with their defaults).
CONFIG = {
    "allow_local_fallback": _option(
        "Without a kinetic_default connection, run jobs on this machine with the embedded "
        "local backend (with a WARNING). Set False in production to make that an error.",
        "boolean",
        "True",
    ),
    "max_xcom_result_bytes": _option(
        "Results larger than this (or not serialisable by Airflow) stay in the store and "
        "XCom carries a reference (load_result).",
        "integer",
        "1048576",
    ),
    "result_signing_key": _option(
        "Deployment secret that per-job result keys derive from; default: [core] fernet_key, "
        "else a key file under $AIRFLOW_HOME/kinetic.",
        "string",
        "",
        sensitive=True,
    ),
    "result_signing_keys": _option(
        "A keyring: deployment secrets separated by commas, newest first. The newest "
        "seals task records and signs new jobs' results; all of them verify, so a key "
        "rotation keeps earlier jobs readable while their secret stays listed. Set, it "
        "replaces result_signing_key (list that one's value second to rotate away from it).",
        "string",
        "",
        sensitive=True,
    ),
    "store_outage_window_s": _option(
        "Seconds a waiting task (its trigger, or a sync wait) rides out a store it cannot "
        "read (a local mount gone, a missing or unreadable root), polling again with backoff, "
        "before giving up; a job is never reported NOT_FOUND meanwhile.",
        "float",
        "600",
    ),
    "k8s_api_attempts": _option("Tries per Kubernetes API call (429/5xx/resets).", "integer", "5"),
    "k8s_api_retry_wait_min": _option("First backoff, seconds.", "float", "0.5"),
    "k8s_api_retry_wait_max": _option("Longest backoff, seconds.", "float", "15"),
    "k8s_api_retry_after_max": _option("Cap on a Retry-After header, seconds.", "float", "30"),
    "history_retention_days": _option(
        "Days a job's history entry (and its archived log) is kept after the job ended; "
        "`airflow kinetic jobs cleanup` deletes older entries.",
        "float",
        "30",
    ),
    "failed_retention_days": _option(
        "Days the artifacts of a job that failed are kept for debugging (cleanup="
        "'on_success'); `airflow kinetic jobs cleanup` deletes older ones.",
        "float",
        "7",
    ),
    "cache_retention_days": _option(
        "Days a cache=True result is reused (its job's artifacts kept) after it was made; "
        "`airflow kinetic jobs cleanup` then deletes the entry and them.",
        "float",
        "30",
    ),
    "cache_wait_s": _option(
        "Seconds a cache=True task waits for a concurrent identical task's result before "
        "it runs its own job.",
        "float",
        "21600",
    ),
    "defer_grace_s": _option(
        "Seconds a deferrable task watches a local job before deferring (a job that ends "
        "sooner never enters the triggerer, nor waits out the trigger's settle hold, "
        "which only a real triggerer keeps: dag.test() runs the trigger in the deferring "
        "process and holds nothing); 0 defers at once.",
        "float",
        "5.0",
    ),
    "trigger_ends_tasks": _option(
        "A deferred task whose job succeeded, with nothing left for a worker to do (no "
        "asset events, output_key, cache, multiple_outputs, OpenLineage or deployment "
        "XCom backend), is ended by its trigger with the job's value and no settle "
        "hold. False: every deferred task resumes on a worker after its job.",
        "boolean",
        "True",
    ),
    "trigger_queue": _option(
        "The triggerer queue Kinetic tasks' triggers run in (Airflow 3.2+ with [triggerer] "
        "queues_enabled = True; start a triggerer with --queues NAME for it); empty: the "
        "task's own queue. Airflow 3.1 has no trigger queues and notes it once.",
        "string",
        "",
    ),
    "max_context_mb": _option(
        "Size cap of a job's context (the zip of the DAG's project directory); over it the "
        "task fails before uploading, naming the largest files. 0 disables the cap.",
        "float",
        "100",
    ),
    "max_payload_mb": _option(
        "Size cap of a job's pickled call (the function, op_args and op_kwargs); over it "
        "the task fails before uploading, naming the largest arguments: pass large data "
        "as Data(path) instead. 0 disables the cap.",
        "float",
        "64",
    ),
    "store_keep_versions": _option(
        "Keys (`store.put`, `airflow kinetic store put`): how many versions each key's "
        "history keeps; older versions drop out of it (their content is collected by "
        "`airflow kinetic data gc` once nothing else refers to it).",
        "integer",
        "10",
    ),
    "local_max_jobs": _option(
        "Local backend: how many local jobs run at once on this machine, across all tasks, "
        "batches, DAG runs and Airflow processes; the others wait (PENDING, 'queued: N jobs "
        "ahead') in submit order, in a queue that survives worker restarts. GPU jobs are "
        "bounded by their devices instead. Unset: the machine's CPU count (its affinity).",
        "integer",
        None,
    ),
    "local_inherit_env": _option(
        "Local backend: a job inherits the worker's whole environment (Airflow settings "
        "and credentials included). False (default): it sees, as a GKE job, only the "
        "captured variables (capture_env_vars) plus what it needs to run here (PATH, HOME, "
        "locale, TZ, temp dir, PYTHONPATH/VIRTUAL_ENV, its devices, kinetic's own settings).",
        "boolean",
        "False",
    ),
    "price_table": _option(
        "Path to a CSV file of USD per chip-hour (columns accelerator,capacity,"
        "usd_per_chip_hour; e.g. tpu-v6e,spot,1.10): task usage lines, the kinetic_usage "
        "XCom, the Kinetic page and `airflow kinetic usage` then show an estimated cost. "
        "Empty: no cost is shown anywhere.",
        "string",
        "",
    ),
}

_S, _N, _B = "string", "number", "boolean"
#: The connection form: extra -> (label, JSON type, placeholder, description).
FORM: dict[str, tuple[str, str, str, str]] = {
    "backend": (
        "Backend",
        _S,
        "auto",
        "Where jobs run: local process, GKE Job, LeaderWorkerSet "
        "(multi-host TPU), JobSet (several TPU slices), or auto (jobset for "
        "num_slices > 1, pathways for multi-host, else gke).",
    ),
    "bucket": (
        "Jobs bucket",
        _S,
        "my-project-kn-my-cluster-jobs",
        "GCS bucket for payloads, "
        "results, outputs and the data cache (default {project}-kn-{cluster}-jobs).",
    ),
    "root": (
        "Local store root",
        _S,
        "/srv/kinetic",
        "Local backend only: the store directory (default $AIRFLOW_HOME/kinetic).",
    ),
    "project": ("GCP project", _S, "my-project", "Project of the GKE cluster and bucket."),
    "zone": ("Zone / location", _S, "us-central2-b", "Location of the GKE cluster."),
    "cluster": ("GKE cluster", _S, "ml-cluster", "Name of the GKE cluster."),
    "namespace": ("Namespace", _S, "default", "Kubernetes namespace for the jobs."),
    "image": (
        "Container image",
        _S,
        "us-docker.pkg.dev/my-project/kinetic/base-tpu:0.0.4",
        "Image the jobs run (must contain this package's runner).",
    ),
    "container_image": (
        "Image mode",
        _S,
        "bundled",
        "bundled (built with Cloud Build, "
        "tagged by content), prebuilt (base_image_repo) or an image URI.",
    ),
    "base_image_repo": (
        "Prebuilt image repository",
        _S,
        "us-docker.pkg.dev/my-project/kinetic",
        "Prebuilt mode: images {repo}/base-{cpu,gpu,tpu}:{version}.",
    ),
    "artifact_registry_location": (
        "Artifact Registry location",
        _S,
        "us-central1",
        "Bundled images' repository location (default: the zone's region).",
    ),
    "artifact_registry_repository": (
        "Artifact Registry repository",
        _S,
        "kn-ml-cluster",
        "Bundled images' repository (default kn-{cluster}).",
    ),
    "service_account": (
        "Kubernetes service account",
        _S,
        "kinetic",
        "Pods run as this service account (Workload Identity to the bucket).",
    ),
    "runner_command": (
        "Runner command",
        _S,
        "python3 -u /app/remote_runner.py",
        "Override the container command that starts the runner.",
    ),
    "gcp_conn_id": (
        "GCP connection",
        _S,
        "google_cloud_default",
        "Google Cloud connection used for GKE credentials (the triggerer needs it too).",
    ),
    "impersonation_chain": (
        "Impersonation chain",
        _S,
        "sa@my-project.iam.gserviceaccount.com",
        "Service account(s) to impersonate for GKE calls.",
    ),
    "endpoint": (
        "Cluster endpoint (JSON)",
        _S,
        '{"host": "https://1.2.3.4", "ca_data": "..."}',
        "Skip the GKE lookup: the API server and its CA.",
    ),
    "data_layout": (
        "Data layout",
        _S,
        "files",
        "files: Data stored per file (uploads follow what changed); kinetic: kinetic "
        "0.0.4's per-tree entries, for jobs run by kinetic's own runner.",
    ),
    "use_internal_ip": ("Use internal IP", _B, "false", "Reach the cluster's private endpoint."),
    "use_dns_endpoint": ("Use DNS endpoint", _B, "false", "Reach the cluster's DNS endpoint."),
    "image_pull_grace_s": (
        "Image pull grace (s)",
        _N,
        "300",
        "Fail a job whose image cannot be pulled for this long.",
    ),
    "schedule_timeout_s": (
        "Scheduling timeout (s)",
        _N,
        "1800",
        "Fail a job whose pod cannot be scheduled (no TPU/GPU capacity) for this long.",
    ),
    "capacity": (
        "Capacity",
        _S,
        "reservation:my-res, spot",
        "Default capacity of tasks that "
        "give none: on-demand, spot, flex-start, reservation:NAME, queue:NAME, "
        "class:NAME, or steps tried in order, comma-separated.",
    ),
    "create_grace_s": (
        "Create grace (s)",
        _N,
        "180",
        "Fail a Job that has no pod after this long (quota, admission).",
    ),
    "ttl_seconds_after_finished": (
        "Finished Job TTL (s)",
        _N,
        "600",
        "Backstop TTL of a finished Job (it is deleted once collected).",
    ),
}


def conn_fields() -> dict[str, Any]:
    from airflow_provider_kinetic.core.backends.registry import backend_kinds

    fields: dict[str, Any] = {}
    for name, (label, kind, placeholder, description) in FORM.items():
        schema: dict[str, Any] = {"type": [kind, "null"]}
        if name == "backend":
            schema["enum"] = [*backend_kinds(), None]
        elif placeholder:
            # Airflow 3.2+'s form shows a field's ``examples`` (the ``placeholders`` of
            # ui-field-behaviour reach only the standard fields there).
            schema["examples"] = [placeholder]
        fields[name] = {"label": label, "description": description, "schema": schema}
    return fields


def field_behaviour() -> dict[str, Any]:
    return {
        "hidden_fields": ["host", "port", "login", "password", "schema"],
        "relabeling": {},
        "placeholders": {name: spec[2] for name, spec in FORM.items()},
    }


def provider_info(version: str) -> dict[str, Any]:
    behaviour = field_behaviour()

    def modules(*names: str) -> list[dict[str, Any]]:
        return [
            {"integration-name": INTEGRATION, "python-modules": [f"{PACKAGE}.{n}" for n in names]}
        ]

    return {
        "package-name": "airflow-provider-kinetic",
        "name": INTEGRATION,
        "description": "Run Python callables on GKE TPU/GPU pods (keras-team/kinetic protocol).",
        "versions": [version],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://github.com/keras-team/kinetic",
                "tags": ["service"],
            }
        ],
        "hooks": modules("hooks.kinetic"),
        "operators": modules("operators.run", "operators.map"),
        "sensors": modules("sensors.job", "sensors.batch"),
        "triggers": modules("triggers.job", "triggers.batch"),
        "extra-links": [
            f"{PACKAGE}.links.{name}"
            for name in (
                "KineticJobLink",
                "KineticLogsLink",
                "KineticOutputLink",
                "KineticBatchLink",
            )
        ],
        "cli": [f"{PACKAGE}.cli.get_kinetic_cli_commands"],
        "config": {"kinetic": {"description": "airflow-provider-kinetic", "options": CONFIG}},
        "task-decorators": [
            {"name": "kinetic", "class-name": f"{PACKAGE}.decorators.kinetic.kinetic_task"}
        ],
        "connection-types": [
            {
                "connection-type": "kinetic",
                "hook-class-name": f"{PACKAGE}.hooks.kinetic.KineticHook",
                "hook-name": INTEGRATION,
                "ui-field-behaviour": {
                    "hidden-fields": behaviour["hidden_fields"],
                    "relabeling": behaviour["relabeling"],
                    "placeholders": behaviour["placeholders"],
                },
                "conn-fields": conn_fields(),
            }
        ],
    }
