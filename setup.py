"""Builds the optional native stat comparison (``core/_lstatcmp.c``); everything else
is in pyproject.toml.  ``optional=True``: without a C compiler the package installs
without it and ``core/fastlstat.py`` compares in Python instead."""

import os

from setuptools import Extension, setup

ext_modules = []
if os.name == "posix":
    ext_modules.append(
        Extension(
            "airflow_provider_kinetic.core._lstatcmp",
            ["airflow_provider_kinetic/core/_lstatcmp.c"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules)
