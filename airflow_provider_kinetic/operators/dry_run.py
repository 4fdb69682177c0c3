"""``KineticRunOperator.dry_run``: the manifests a task would submit, creating nothing."""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.backends.k8s.manifests import to_yaml
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.jobs.fallback import describe_step
from airflow_provider_kinetic.core.jobs.submit import plan_job
from airflow_provider_kinetic.deployment.signing import deployment_secret


def dry_run(op: Any) -> dict[str, Any]:
    """The manifest ``op`` (a ``KineticRunOperator``) would submit, printed as YAML
    with each capacity step's after it; returns the first step's manifest.

    Packs the payload (so its SHA-256 is real) and hashes local Data, but uploads
    nothing and needs no cluster credentials.  Templates are used as they stand.
    Secrets (the result key) appear as references, never as values.
    """
    config = op.hook.get_config()
    store = config.store()  # a dry run needs no credentials
    identity = {"dag_id": op.dag_id, "task_id": op.task_id, "run_id": "dry_run"}
    request = op.build_request(identity, store.uri)
    image = op.resolve_image(request, config, store, build=False)
    planned = plan_job(request, config, store, "job-dryrun00", deployment_secret())
    manifest = backend_class(planned.template.backend).manifest(planned.spec)
    print("\n".join(op.image_report(image, config)))
    chain = planned.template.options.capacity
    for step in range(len(chain)):  # a fallback chain: what each step would send
        job = (
            planned
            if step == 0
            else plan_job(
                request, config, store, f"job-dryrun{step:02d}", deployment_secret(), step
            )
        )
        if len(chain) > 1:
            print(("---\n" if step else "") + f"# capacity: {describe_step(chain, step)}")
        print(to_yaml(backend_class(job.template.backend).manifest(job.spec)))
    return manifest
