"""This package's version: one literal, read by setuptools (pyproject.toml), written
into every payload's client fingerprint and into the runtime wheel's metadata."""

__version__ = "0.1.0"
