"""Pod entry point (``python -m airflow_provider_kinetic.runner``); Airflow-free."""
