"""Keys: names for data.  A key points to content hashes (its versions) in the data
cache; put/ls/rm in ``keystore``, get in ``fetch``, gc's view in ``gc``, a job's own
store in ``env``.  Airflow-free: the Airflow side (which connection, who) is
``airflow_provider_kinetic/keys.py`` (the public ``store``)."""
