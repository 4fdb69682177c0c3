"""Runs one local job's command and records its exit code on disk.

Started by the local backend as a session leader, so it survives the Airflow task
process; the exit code file is written atomically, after the child has ended, so a
reader never sees a job as finished while it is still writing its result.  The job's
secret env (``secrets.json``, 0600) is read into the child's environment and the file
is deleted when the job ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

SECRETS_FILE = "secrets.json"
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
    tmp = os.path.join(jdir, f"exit_code.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(code))
    os.replace(tmp, os.path.join(jdir, "exit_code"))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
