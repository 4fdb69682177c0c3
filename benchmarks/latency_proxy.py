"""A loopback TCP proxy that adds latency, standing in for a far-away bucket.

    python benchmarks/latency_proxy.py --upstream 127.0.0.1:PORT --rtt-ms 50 [--mbps 25]

It listens on ``127.0.0.1`` only (a free port, printed as the first line of stdout),
forwards every connection to ``--upstream`` and delays each direction by half the
round trip, plus one round trip to open a connection (a TCP handshake).  Bytes are
queued with the time they may leave, as on a long link.  ``--mbps`` caps each
connection's throughput in each direction (MB/s, 10**6 bytes): one stream to a real
bucket is limited by its window and the path while parallel streams add up, so a
transfer that opens several connections gets several times the cap; without it,
throughput is not limited.  ``--total-mbps`` caps what every connection together
receives from the upstream (one shared link: a machine's, or a bucket's, egress), and
``--count-file`` gets the bytes carried each way so far (JSON) whenever a line
arrives on stdin (``counted`` is printed on stdout once it is written).

It stops by itself: when its stdin reaches end of file (the parent closed it or
died) or after ``--max-seconds``, whichever comes first.  Stdlib only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading

#: Bytes read at a time; chunks queued per direction (the window a link holds).
_CHUNK = 256 * 1024
_QUEUED = 64


class _Link:
    """A cap shared by every connection in one direction, and what it carried."""

    def __init__(self, rate: float) -> None:
        self.rate, self.free, self.bytes = rate, 0.0, 0

    def slot(self, now: float, size: int) -> float:
        """When ``size`` bytes may leave (``now`` if uncapped); books the link."""
        self.bytes += size
        if not self.rate:
            return now
        due = max(now, self.free)
        self.free = due + size / self.rate
        return due


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay: float,
    rate: float,
    link: _Link,
) -> None:
    """Copy ``reader`` to ``writer``, each chunk leaving ``delay`` s after it arrived and,
    with a ``rate`` (bytes/s, 0: none), not before the previous one had time to pass."""
    loop = asyncio.get_running_loop()
    # Bounded: a capped connection pushes back on its sender instead of buffering it all.
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=_QUEUED)

    async def feed() -> None:
        free = 0.0  # when the capped link is free for the next chunk
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(_CHUNK):
                due = link.slot(loop.time(), len(chunk)) + delay
                if rate:
                    due = max(due, free)
                    free = due + len(chunk) / rate
                await queue.put((due, chunk))
        await queue.put((max(loop.time() + delay, free), b""))

    async def drain() -> None:
        while True:
            due, chunk = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not chunk:
                with contextlib.suppress(ConnectionError, OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(chunk)
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()

    await asyncio.gather(feed(), drain())


async def _handle(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream: tuple[str, int],
    rtt: float,
    rate: float,
    links: tuple[_Link, _Link],
) -> None:
    """One client connection.  Cancellation (the proxy stopping) ends it quietly: the
    stream server would report a cancelled handler as an error."""
    server_w = None
    try:
        await asyncio.sleep(rtt)  # the handshake a real connection would pay
        server_r, server_w = await asyncio.open_connection(*upstream)
        await asyncio.gather(
            _pump(client_r, server_w, rtt / 2, rate, links[0]),
            _pump(server_r, client_w, rtt / 2, rate, links[1]),
        )
    except (asyncio.CancelledError, OSError):
        pass
    finally:
        for w in (client_w, server_w):
            if w is not None:
                w.close()


async def _serve(
    upstream: tuple[str, int],
    rtt: float,
    rate: float,
    max_seconds: float,
    links: tuple[_Link, _Link],
    count_file: str | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:  # EOF: the parent is gone or done with us
        with contextlib.suppress(OSError, ValueError):
            while sys.stdin.buffer.readline():  # a line: write the counts so far
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(report)
        with contextlib.suppress(RuntimeError):  # the loop already closed
            loop.call_soon_threadsafe(stop.set)

    def report() -> None:
        if count_file:
            with open(count_file, "w") as f:
                json.dump({"up": links[0].bytes, "down": links[1].bytes}, f)
        print("counted", flush=True)

    threading.Thread(target=watch_stdin, daemon=True).start()
    loop.call_later(max_seconds, stop.set)
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, upstream, rtt, rate, links), host="127.0.0.1", port=0
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    await stop.wait()
    server.close()
    # Open connections end with the proxy: cancel their tasks before the loop closes.
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--mbps", type=float, default=0.0, help="per-connection cap, MB/s")
    parser.add_argument(
        "--total-mbps", type=float, default=0.0, help="cap on all downloads together, MB/s"
    )
    parser.add_argument("--count-file", help="write {up, down} bytes here (JSON) at the end")
    parser.add_argument("--max-seconds", type=float, default=900.0)
    ns = parser.parse_args()
    host, _, port = ns.upstream.rpartition(":")
    rate = ns.mbps * 1e6
    links = (_Link(0.0), _Link(ns.total_mbps * 1e6))  # (to upstream, from upstream)
    upstream = (host, int(port))
    asyncio.run(_serve(upstream, ns.rtt_ms / 1000, rate, ns.max_seconds, links, ns.count_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
