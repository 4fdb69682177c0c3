"""Runs one local job's command and records its exit code on disk.

Started by the local backend as a session leader, so it survives the Airflow task
process; the exit code file is written atomically, after the child has ended, so a
reader never sees a job as finished while it is still writing its result.  The job's
secret env (``secrets.json``, 0600) is read into the child's environment and the file
is deleted when the job ends.

The child gets a temp dir of its own (``TMPDIR``, named in ``{job dir}/tmpdir``) that
the supervisor removes when the child ends, however it ended (``os._exit``, a signal,
a segfault): the runner's work dir and whatever the function left in temp go with it.
If the supervisor itself is killed, the local backend's ``release`` removes the dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

SECRETS_FILE = "secrets.json"
#: The file in the job dir that names the child's temp dir.
TMPDIR_FILE = "tmpdir"
#: ``core.data.locallinks.HOST_TMPDIR_ENV``, spelled out: this entry point starts once
#: per job and imports nothing of the package (the data package costs ~25 ms to import).
HOST_TMPDIR_ENV = "KINETIC_HOST_TMPDIR"
#: Shorter values are not masked (as Airflow's masker, which skips very short secrets).
MIN_MASK = 5


def main(argv: list[str]) -> int:
    jdir, sep, *command = argv
    if sep != "--" or not command:
        sys.stderr.write("usage: supervise JOB_DIR -- COMMAND...\n")
        return 2
    secrets_path = os.path.join(jdir, SECRETS_FILE)
    env = dict(os.environ)
    secrets: dict[str, str] = {}
    if os.path.exists(secrets_path):
        with open(secrets_path) as f:
            secrets = json.load(f)
        env.update(secrets)
    # Secret values never reach the job's log file: the output is masked line by line.
    masks = sorted({v.encode() for v in secrets.values() if len(v) >= MIN_MASK}, key=len)[::-1]
    os.umask(0o077)  # whatever the job writes (result, downloads) is owner-only
    tmp_dir = tempfile.mkdtemp(prefix=f"kinetic-job-{os.path.basename(jdir)}-")
    write_atomic(os.path.join(jdir, TMPDIR_FILE), tmp_dir)
    env[HOST_TMPDIR_ENV] = tempfile.gettempdir()  # what jobs share (volume link counts)
    env["TMPDIR"] = tmp_dir
    child = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE if masks else None, stderr=subprocess.STDOUT
    )

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    if masks:
        out = sys.stdout.buffer
        for line in child.stdout:
            for value in masks:
                line = line.replace(value, b"***")
            out.write(line)
            out.flush()
    code = child.wait()
    with contextlib.suppress(FileNotFoundError):
        os.remove(secrets_path)
    # Before the exit code: a reader that sees the job ended sees its temp files gone.
    shutil.rmtree(tmp_dir, ignore_errors=True)
    write_atomic(os.path.join(jdir, "exit_code"), str(code))
    return code


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
