"""Builds the optional native stat comparison (``core/data/hashing/_lstatcmp.c``); everything else
is in pyproject.toml.  ``optional=True``: without a C compiler the package installs
without it and ``core/data/hashing/fastlstat.py`` compares in Python instead."""

import os

from setuptools import Extension, setup

ext_modules = []
if os.name == "posix":
    ext_modules.append(
        Extension(
            "airflow_provider_kinetic.core.data.hashing._lstatcmp",
            ["airflow_provider_kinetic/core/data/hashing/_lstatcmp.c"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules)
