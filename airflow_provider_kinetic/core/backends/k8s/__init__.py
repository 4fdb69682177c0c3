"""The Kubernetes backends (a GKE Job, a Pathways LeaderWorkerSet, a multi-slice JobSet):
manifests, API calls and their retries, status diagnosis, logs and capacity waits."""
