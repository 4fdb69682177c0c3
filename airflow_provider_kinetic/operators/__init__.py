"""The operators DAG authors use: ``KineticRunOperator`` (one job) and
``KineticMapOperator`` (one function over many inputs), on their shared base
(``common.py``).  Top of the package: uses triggers, hooks, links and core.
"""
