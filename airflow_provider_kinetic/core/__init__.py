"""The Airflow-free core: everything a job is and does, usable from plain Python and
from the runner in a pod.  Never imports Airflow (an import-linter contract).

Layers, top to bottom (``pyproject.toml`` [tool.importlinter] holds them as contracts;
a module imports only from its own layer's lower modules and from layers below)::

    batch/      a function over many inputs: plan, run, resume, state, child logs
    jobs/       one job: request, pack, payload, template, submit, results, try records
    config.py   a target's settings, checked against the backend registry
    backends/ | runtime/ | keys/   where a job runs (local/, k8s/) | what it runs in
                (image, requirements) | named data (peer/ transfer, tensors/)
    settings.py : spec/      plain target settings | what a job is (handle, pod spec)
    data/       Data, its schemes, content hash + stat cache, data cache, mounts
    storage/    object stores (gs://, file://)
    catalog/    what can be scheduled: accelerator table and parser, capacity kinds
    errors.py | version.py | durations.py | metrics.py
"""
