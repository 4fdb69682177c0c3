"""The hook: ``KineticHook`` turns a ``kinetic`` connection (or its absence) into an object
store and a backend.  What it reads lives in ``deployment/`` and ``gcp/``."""
