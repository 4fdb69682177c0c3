"""Google Cloud through providers-google: GCS and GKE credentials from Airflow's Google
connection, and bundled image builds with Cloud Build."""
