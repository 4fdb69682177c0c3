"""One job from request to result: request checks, packing, payload, template, submit,
results and result references, signing, the per-task try record, poll schedules.
Uses config, backends, runtime, spec, data and storage; never batch/ or Airflow.
"""
