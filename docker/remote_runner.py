"""kinetic's runner path; runs airflow-provider-kinetic's runner."""

import runpy

runpy.run_module("airflow_provider_kinetic.runner", run_name="__main__", alter_sys=True)
