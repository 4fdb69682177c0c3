"""Deferrable waits on the triggerer's event loop: ``KineticJobTrigger`` and
``KineticBatchTrigger`` (class paths are stored in Airflow's database: never move
them), the settle hold and user-kill handling.  Use hooks and core.
"""
