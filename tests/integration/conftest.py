"""Fixtures shared by the integration tests (defined in ``tests/fixtures/``); a module
that defines its own ``config`` or ``backend`` fixture uses that one instead."""

from tests.fixtures.local_jobs import backend, config

__all__ = ["backend", "config"]
