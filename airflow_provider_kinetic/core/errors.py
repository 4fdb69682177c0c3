"""The root of every error this package raises on purpose.

Core errors keep their natural built-in base too (``ValueError`` for bad input,
``FileNotFoundError`` for a missing object, ...), so existing ``except`` clauses
keep working, while ``except KineticError`` catches everything kinetic-specific.
The Airflow layer adds ``AirflowException`` subclasses on top (``exceptions.py``).
"""

from __future__ import annotations


class KineticError(Exception):
    """Base class of the errors raised by airflow-provider-kinetic."""
