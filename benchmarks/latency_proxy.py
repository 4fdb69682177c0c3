"""A loopback TCP proxy that adds latency, standing in for a far-away bucket.

    python benchmarks/latency_proxy.py --upstream 127.0.0.1:PORT --rtt-ms 50

It listens on ``127.0.0.1`` only (a free port, printed as the first line of stdout),
forwards every connection to ``--upstream`` and delays each direction by half the
round trip, plus one round trip to open a connection (a TCP handshake).  Throughput
is not limited: bytes are queued with the time they may leave, as on a long link.

It stops by itself: when its stdin reaches end of file (the parent closed it or
died) or after ``--max-seconds``, whichever comes first.  Stdlib only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk leaving ``delay`` s after it arrived."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def feed() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(256 * 1024):
                queue.put_nowait((loop.time() + delay, chunk))
        queue.put_nowait((loop.time() + delay, b""))

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
) -> None:
    """One client connection.  Cancellation (the proxy stopping) ends it quietly: the
    stream server would report a cancelled handler as an error."""
    server_w = None
    try:
        await asyncio.sleep(rtt)  # the handshake a real connection would pay
        server_r, server_w = await asyncio.open_connection(*upstream)
        await asyncio.gather(_pump(client_r, server_w, rtt / 2), _pump(server_r, client_w, rtt / 2))
    except (asyncio.CancelledError, OSError):
        pass
    finally:
        for w in (client_w, server_w):
            if w is not None:
                w.close()


async def _serve(upstream: tuple[str, int], rtt: float, max_seconds: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:  # EOF: the parent is gone or done with us
        with contextlib.suppress(OSError, ValueError):
            sys.stdin.buffer.read()
        with contextlib.suppress(RuntimeError):  # the loop already closed
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    loop.call_later(max_seconds, stop.set)
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, upstream, rtt), host="127.0.0.1", port=0
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
    parser.add_argument("--max-seconds", type=float, default=900.0)
    ns = parser.parse_args()
    host, _, port = ns.upstream.rpartition(":")
    asyncio.run(_serve((host, int(port)), ns.rtt_ms / 1000, ns.max_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
