"""What a deployment configures, read on the Airflow side: the ``kinetic`` connection and its
config, the backend it names, the connection test, signing secrets, prices and the metrics
sink.  ``hooks/kinetic.py`` puts them together."""
