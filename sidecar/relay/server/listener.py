"""The proxy port's listening sockets: every connection waiting in the kernel's accept queue
is accepted at the next turn of the loop, not one a turn.

uvloop's server (libuv from 1.45 on) accepts one connection per turn of the event loop and
leaves the rest to the next poll. While the loop is saturated, a turn lasts as long as the
work of every busy connection, so connections opened together are accepted one a turn: the
last of them wait in the accept queue, their first request already sent, for as many turns
as there are connections ahead of them, while those accepted first are served turn after
turn. asyncio's selector loop accepts up to its ``backlog`` at once, as nginx's
``multi_accept`` does; :class:`Listener` does the same on any loop: it watches each
listening socket with ``add_reader``, accepts until the queue is empty (at most
``backlog`` a turn) and hands each socket to the loop's ``connect_accepted_socket``. Every
connection is then read in the same turns as the others. The connection cap is still the
protocol's to answer (``ProxyConnection.connection_made``).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable

import structlog

__all__ = ["LISTEN_BACKLOG", "Listener", "bind_listening"]

_log = structlog.get_logger("sidecar.app")

LISTEN_BACKLOG = 4096
"""Connections the kernel queues for the next turn of the loop (nginx's ``backlog`` in the
benchmark's configuration; the kernel holds it to ``net.core.somaxconn``). More clients
than this opening in one turn of a saturated loop are dropped and retry their SYN a second
later."""

_RETRY_LATER = (BlockingIOError, InterruptedError, ConnectionAbortedError)
# Out of file descriptors (or memory): the connection stays in the kernel's queue.
_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_RETRY_SECONDS = 1.0


async def bind_listening(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to, bound as
    ``loop.create_server`` binds them (``SO_REUSEADDR``, IPv6 sockets IPv6 only) and
    failing with its message."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    seen: set[tuple[int, object]] = set()
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"error while attempting to bind on address {address!r}: "
                    f"{(exc.strerror or str(exc)).lower()}",
                ) from None
        for sock in sockets:
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Listener:
    """Accepts the connections waiting on ``sockets`` for ``protocol_factory`` (the module
    doc); ``close`` stops accepting and closes the sockets, and a connection accepted but
    not yet handed to the loop is closed. What ``ProxyPort`` asks of an ``asyncio.Server``:
    ``sockets``, ``close``, ``wait_closed``."""

    def __init__(
        self,
        protocol_factory: Callable[[], asyncio.Protocol],
        sockets: list[socket.socket],
        backlog: int,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._factory = protocol_factory
        self.sockets = sockets
        self._batch = max(backlog, 1)
        self._opening: set[asyncio.Task[None]] = set()
        self._closed = False
        for sock in sockets:
            self._watch(sock)

    def _watch(self, sock: socket.socket) -> None:
        if not self._closed:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(self._batch):
            try:
                conn, _ = sock.accept()
            except _RETRY_LATER:
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_FILES:
                    raise
                # The connection stays queued: try again in a second rather than at every
                # turn (the socket stays readable), as asyncio's own server does.
                _log.warning("accept_failed", reason=exc.strerror)
                self._loop.remove_reader(sock.fileno())
                self._loop.call_later(_RETRY_SECONDS, self._watch, sock)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._open(conn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open(self, conn: socket.socket) -> None:
        if self._closed:  # accepted as the port stopped listening: closed, as the queue's are
            conn.close()
            return
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:  # the client reset it before its transport was made
            conn.close()

    def close(self) -> None:
        self._closed = True
        for sock in self.sockets:
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
                sock.close()

    async def wait_closed(self) -> None:
        """Until the connections accepted before :meth:`close` are made or closed (the
        connections themselves are the port's to close)."""
        await asyncio.gather(*self._opening, return_exceptions=True)
