"""The job runner (``python -m airflow_provider_kinetic.runner``, kinetic 0.0.4's flags):
runs a packed function in a pod or as a local process.  Airflow-free, and imports only
what a pod has: this package's core data/jobs modules, cloudpickle, google-cloud-storage.
"""
