"""What an image build is given: its files and their archive, decided elsewhere.

A bundled image's build context (:func:`build_context`: the Dockerfile that
``images.plan_image`` chose, the job's requirements, kinetic's runner shim and this
package's wheel) goes to Cloud Build as one deterministic tarball
(:func:`context_tarball`).  The prebuilt images' context is ``docker/`` in the
repository (:func:`write_prebuilt_context`; a test checks it is current):
``python -m airflow_provider_kinetic.core.runtime.buildfiles docker/``.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile

from airflow_provider_kinetic.core.runtime import wheel
from airflow_provider_kinetic.core.runtime.images import (
    CATEGORIES,
    PUBLISHED_PYTHON,
    ImagePlan,
    render_dockerfile,
)

#: kinetic's runner path (``KINETIC_RUNNER_COMMAND``) starts this package's runner.
RUNNER_SHIM = (
    '"""kinetic\'s runner path; runs airflow-provider-kinetic\'s runner."""\n\n'
    "import runpy\n\n"
    'runpy.run_module("airflow_provider_kinetic.runner", run_name="__main__", alter_sys=True)\n'
)


def build_context(plan: ImagePlan) -> dict[str, bytes]:
    """The files of a bundled image's build (path in the context -> bytes)."""
    if plan.mode != "bundled" or plan.dockerfile is None:
        raise ValueError(f"only a bundled image is built here, not a {plan.mode} one")
    return {
        "Dockerfile": plan.dockerfile.encode(),
        "requirements.txt": plan.requirements.text.encode(),
        "remote_runner.py": RUNNER_SHIM.encode(),
        f"dist/{wheel.wheel_name()}": wheel.build_wheel(),
    }


def context_tarball(files: dict[str, bytes]) -> bytes:
    """A deterministic ``.tar.gz`` of ``files`` (Cloud Build's source archive)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


def write_prebuilt_context(folder: str, python: str = PUBLISHED_PYTHON) -> list[str]:
    """Write the prebuilt images' build context: ``Dockerfile.{cpu,gpu,tpu}``, the
    runner shim and ``dist/`` (this package's wheel; not committed).  Returns the
    paths written.  ``docker/`` in the repository is this output (a test checks)."""
    written = []
    os.makedirs(os.path.join(folder, "dist"), exist_ok=True)
    files = {f"Dockerfile.{c}": render_dockerfile(c, python, False).encode() for c in CATEGORIES}
    files["remote_runner.py"] = RUNNER_SHIM.encode()
    files[f"dist/{wheel.wheel_name()}"] = wheel.build_wheel()
    for name, data in files.items():
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(data)
        written.append(path)
    return written


if __name__ == "__main__":  # python -m airflow_provider_kinetic.core.runtime.buildfiles docker/
    for written_path in write_prebuilt_context(sys.argv[1] if len(sys.argv) > 1 else "docker"):
        print(written_path)
