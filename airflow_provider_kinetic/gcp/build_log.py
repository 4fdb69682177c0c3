"""Follow a Cloud Build's log object in GCS and copy its lines into the task log.

A bundled-image build is asked to log to the jobs bucket only (``GCS_ONLY``), so its
log is one object, ``{logs_bucket}/log-{build_id}.txt``, that Cloud Build rewrites
with more text as the build runs.  Between status polls :class:`BuildLogTail` reads
the bytes after those already shown (one ranged GET through the store's own
``google.cloud.storage`` client, so the store's credentials apply) and logs each
*whole* line; a line still being written is left for the next read, so no line is
shown twice or cut in two.  Each read is bounded (lines and bytes), so a chatty
build cannot stall the status polling; what is left over is read on later polls and
in :meth:`BuildLogTail.drain` once the build has ended.

The log is a convenience: a log that cannot be read (no permission, an outage) is
reported once and then left alone, and never fails the build.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

#: Prefix of every build-log line in the task log.
LINE_PREFIX = "[cloud build] "
#: Lines and bytes one read may show (the rest waits for the next read).
MAX_LINES_PER_READ = 200
MAX_BYTES_PER_READ = 256 << 10
#: Reads :meth:`BuildLogTail.drain` makes after the build has ended, at most.
MAX_DRAIN_READS = 100
#: Lines kept for an error message.
LAST_LINES = 20
#: How long one read retries transient errors (the store's 120 s would hold up the
#: status polling for as long on an outage).
READ_RETRY_S = 15.0


class BuildLogTail:
    """The unread end of one build-log object; see the module docstring."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        logger: logging.Logger,
        *,
        max_lines: int = MAX_LINES_PER_READ,
        max_bytes: int = MAX_BYTES_PER_READ,
        retry_s: float = READ_RETRY_S,
    ) -> None:
        """``client``: a ``google.cloud.storage.Client``; ``logger``: where lines go."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        self.bucket, self.key = bucket, key
        self.offset = 0
        self._client = client
        self._log = logger
        self._max_lines = max(1, max_lines)
        self._max_bytes = max(1, max_bytes)
        self._last: collections.deque[str] = collections.deque(maxlen=LAST_LINES)
        self._broken = False
        self._retry = DEFAULT_RETRY.with_timeout(retry_s)

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.key}"

    @property
    def last_lines(self) -> list[str]:
        """The last lines shown (at most ``LAST_LINES``), oldest first."""
        return list(self._last)

    def poll(self, *, final: bool = False) -> int:
        """Show the whole lines written since the last read, up to the bounds; returns
        how many were shown.  ``final``: the build has ended, so a last line without
        its newline is complete and shown too."""
        chunk = self._read()
        if not chunk:
            return 0
        end = chunk.rfind(b"\n") + 1
        at_end = len(chunk) < self._max_bytes  # the read reached the object's end
        if end == 0 and not at_end:
            end = len(chunk)  # one line longer than a read: shown in pieces
        lines = chunk[:end].splitlines(keepends=True)[: self._max_lines]
        if final and at_end and end < len(chunk) and len(lines) < self._max_lines:
            lines.append(chunk[end:])  # an ended log without a last newline
        for raw in lines:
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self._log.info("%s%s", LINE_PREFIX, text)
            self._last.append(text)
        self.offset += sum(len(raw) for raw in lines)
        return len(lines)

    def drain(self, max_reads: int = MAX_DRAIN_READS) -> bool:
        """After the build has ended: show what is left, in bounded reads.  False when
        the reads ran out first (the rest is only in the object, which is then kept)."""
        for _ in range(max_reads):
            if self.poll(final=True) == 0:
                return True
        self._log.info("%s... (the rest is in %s)", LINE_PREFIX, self.uri)
        return False

    def delete(self) -> None:
        """Remove the log object (its lines are in the task log); best effort."""
        from google.api_core import exceptions as gexc

        try:
            self._client.bucket(self.bucket).delete_blob(self.key, retry=self._retry)
        except (gexc.GoogleAPIError, OSError) as exc:
            self._log.debug("build log %s not deleted: %s", self.uri, exc)

    def _read(self) -> bytes:
        """The next bytes from ``offset``; empty when there are none (yet)."""
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as auth_exc

        if self._broken:
            return b""
        blob = self._client.bucket(self.bucket).blob(self.key)
        try:
            end = self.offset + self._max_bytes - 1
            return blob.download_as_bytes(start=self.offset, end=end, retry=self._retry)
        except (gexc.NotFound, gexc.RequestRangeNotSatisfiable):
            return b""  # not written yet, or nothing past ``offset``
        except (gexc.GoogleAPIError, auth_exc.GoogleAuthError, OSError) as exc:
            self._broken = True
            self._log.warning(
                "cannot read the Cloud Build log %s (%s): the task log shows the build's "
                "status only; the identity needs read access to the jobs bucket",
                self.uri,
                exc,
            )
            return b""
