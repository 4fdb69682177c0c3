"""Where a job runs: the backend registry, the ``Backend`` contract and its kinds
(local process, GKE Job, Pathways LeaderWorkerSet) with their Kubernetes manifests,
status diagnosis, logs and API drivers.  Uses settings, spec, data, storage and
accelerators; jobs/ and config use it.
"""
