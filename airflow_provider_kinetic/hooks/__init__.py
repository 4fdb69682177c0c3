"""Airflow connections -> core: the ``kinetic`` connection and its config, GCS and GKE
credentials from Airflow's Google connection, bundled image builds, the signing secret.
Uses core and ``provider_info``; operators, sensors, triggers and the CLI use it.
"""
