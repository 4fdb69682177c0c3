"""A port-forward to a pod through the Kubernetes API, as ``kubectl port-forward`` does.

Debug mode (``core.spec.debug``) reaches a debug job's debugpy server this way: the
pod's port is never exposed beyond the pod; a local loopback port is forwarded to it
over the API server's ``pods/portforward`` websocket, with the same credentials
every other call of the backend uses.  Each local connection gets a websocket of its
own (the ``kubernetes`` client's ``portforward``), relayed both ways until either end
closes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: The local side listens on loopback only.
LOCAL_HOST = "127.0.0.1"
_CHUNK = 64 * 1024


class PortForward:
    """``127.0.0.1:local_port`` -> ``pod:remote_port`` in ``namespace`` (``local_port``
    0: any free port; :attr:`local_port` says which).  :meth:`start` serves in a thread
    of its own; :meth:`close` stops it and every connection."""

    def __init__(
        self,
        api_client_factory: Callable[[], Any],
        namespace: str,
        pod: str,
        remote_port: int,
        local_port: int = 0,
    ) -> None:
        self._factory = api_client_factory
        self.namespace, self.pod, self.remote_port = namespace, pod, remote_port
        try:
            self._listener = socket.create_server((LOCAL_HOST, local_port))
        except OSError as exc:
            raise OSError(
                f"cannot listen on {LOCAL_HOST}:{local_port} ({exc}); pick another with --port"
            ) from exc
        self.local_port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        #: Errors the pod's side reported (a port nothing listens on, ...), in order.
        self.errors: list[str] = []

    def start(self) -> PortForward:
        threading.Thread(target=self._accept, name="kinetic-port-forward", daemon=True).start()
        return self

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> PortForward:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- serving ----------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                local, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._connection, args=(local,), name="kinetic-port-forward-conn",
                daemon=True,
            ).start()  # fmt: skip

    def _connection(self, local: socket.socket) -> None:
        from kubernetes import client as k8s
        from kubernetes.stream import portforward

        try:
            api = k8s.CoreV1Api(self._factory())
            forward = portforward(
                api.connect_get_namespaced_pod_portforward,
                self.pod,
                self.namespace,
                ports=str(self.remote_port),
            )
            remote = forward.socket(self.remote_port)
            remote.setblocking(True)
        except Exception as exc:  # noqa: BLE001 - one connection fails, the forward stays
            log.warning("port-forward to %s/%s failed: %s", self.namespace, self.pod, exc)
            self.errors.append(str(exc))
            local.close()
            return
        with self._lock:
            self._open += [local, remote]
        back = threading.Thread(target=_pump, args=(remote, local), daemon=True)
        back.start()
        _pump(local, remote)
        back.join()
        error = forward.error(self.remote_port)
        if error:
            log.warning("port-forward to %s/%s: %s", self.namespace, self.pod, error)
            self.errors.append(error)
        with contextlib.suppress(Exception):
            forward.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends; then end ``sink``'s writes."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
