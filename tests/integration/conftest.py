"""Fixtures shared by the integration tests (defined in ``tests/fixtures/``); a module
that defines its own ``config``, ``backend`` or ``store`` fixture uses that one instead."""

from tests.fixtures.local_jobs import backend, config
from tests.fixtures.stores import store

__all__ = ["backend", "config", "store"]
