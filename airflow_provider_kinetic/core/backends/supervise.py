"""Runs one local job's command and records its exit code on disk.

Started by the local backend as a session leader, so it survives the Airflow task
process; the exit code file is written atomically, after the child has ended, so a
reader never sees a job as finished while it is still writing its result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    jdir, sep, *command = argv
    if sep != "--" or not command:
        sys.stderr.write("usage: supervise JOB_DIR -- COMMAND...\n")
        return 2
    child = subprocess.Popen(command)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    code = child.wait()
    tmp = os.path.join(jdir, f"exit_code.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(code))
    os.replace(tmp, os.path.join(jdir, "exit_code"))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
