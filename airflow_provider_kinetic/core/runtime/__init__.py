"""What a job runs *in*: its requirements and its container image.

Airflow-free, like the rest of ``core``: the operators resolve requirements and the
image plan here once per task, and only the Airflow layer
(``gcp/image_build.py``) talks to Artifact Registry and Cloud Build.
"""
