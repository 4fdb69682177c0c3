"""The root of every error this package raises on purpose.

Core errors keep their natural built-in base too (``ValueError`` for bad input,
``FileNotFoundError`` for a missing object, ...), so existing ``except`` clauses
keep working, while ``except KineticError`` catches everything kinetic-specific.
The Airflow layer adds ``AirflowException`` subclasses on top (``exceptions.py``).
"""

from __future__ import annotations


class KineticError(Exception):
    """Base class of the errors raised by airflow-provider-kinetic."""


class KineticInternalError(KineticError, RuntimeError):
    """A bug of kinetic's own, never an error of the user's function or inputs: say so,
    with what was lost (e.g. a batch input that never ran although nothing stopped it)."""
