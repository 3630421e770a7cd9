"""A raw TCP server that answers each accepted connection with a script: exact bytes, cut
heads, stalls, closes. It records every byte it read, every request (raw, framing
included) and every connection, and notices when the client closes one.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable


def response(
    body: bytes = b"ok", status: bytes = b"200 OK", *headers: bytes, version: bytes = b"1.1"
) -> bytes:
    """A response framed by Content-Length."""
    lines = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/%b %b\r\n%bContent-Length: %d\r\n\r\n%b" % (
        version,
        status,
        lines,
        len(body),
        body,
    )


# -- the scripted server -------------------------------------------------------------------


class Peer:
    """The server's side of one accepted connection; every byte it read is in ``received``."""

    def __init__(
        self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.index = index
        self.reader = reader
        self.writer = writer
        self.received = bytearray()
        self.requests: list[bytes] = []
        self.eof = asyncio.Event()  # the client closed the connection (EOF or reset)
        self.closed_by_server = False
        self.go = asyncio.Event()  # a test's cue to the script

    async def _until(self, separator: bytes) -> bytes:
        data = await self.reader.readuntil(separator)
        self.received += data
        return data

    async def _exactly(self, n: int) -> bytes:
        data = await self.reader.readexactly(n)
        self.received += data
        return data

    async def read_head(self) -> bytes | None:
        """The next request head, or None when the client closed between requests."""
        try:
            return await self._until(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            self.received += exc.partial
            if exc.partial:
                raise
        except ConnectionResetError:
            pass
        self.eof.set()
        return None

    async def read_request(self) -> bytes | None:
        """The next whole request as raw bytes (head and framed body), recorded."""
        head = await self.read_head()
        if head is None:
            return None
        raw = bytearray(head)
        fields: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n")[1:]:
            name, colon, value = line.partition(b":")
            if colon:
                fields[name.strip().lower()] = value.strip()
        if fields.get(b"transfer-encoding") == b"chunked":
            while True:
                size_line = await self._until(b"\r\n")
                raw += size_line
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    while (line := await self._until(b"\r\n")) != b"\r\n":
                        raw += line
                    raw += b"\r\n"
                    break
                raw += await self._exactly(size + 2)
        elif b"content-length" in fields:
            raw += await self._exactly(int(fields[b"content-length"]))
        self.requests.append(bytes(raw))
        return bytes(raw)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def read_to_eof(self) -> None:
        try:
            while data := await self.reader.read(1 << 16):
                self.received += data
        except ConnectionError:
            pass
        self.eof.set()

    def close(self) -> None:
        self.closed_by_server = True
        self.writer.close()

    def hard_close(self) -> None:
        """Shut this side down now, synchronously: the FIN is on its way but the client's
        event loop has not run, so the pool still believes the connection is usable."""
        fd = self.writer.get_extra_info("socket").fileno()
        dup = socket.socket(fileno=os.dup(fd))
        dup.shutdown(socket.SHUT_RDWR)
        dup.close()
        self.closed_by_server = True
        self.go.set()


Script = Callable[[Peer], Awaitable[None]]


class ScriptedServer:
    """Runs ``script(peer)`` for each accepted connection; afterwards, unless the script
    closed it, reads until the client closes (so a closed connection is always noticed)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.peers: list[Peer] = []
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def accepted(self) -> int:
        return len(self.peers)

    @property
    def requests(self) -> list[bytes]:
        return [r for p in self.peers for r in p.requests]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = Peer(len(self.peers), reader, writer)
        self.peers.append(peer)
        try:
            await self.script(peer)
            if not peer.closed_by_server:
                await peer.read_to_eof()
        except (ConnectionError, asyncio.IncompleteReadError):
            peer.eof.set()  # the client closed in the middle of what the script read
        finally:
            writer.close()
            self._tasks.discard(task)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()


def serve(*answers: bytes) -> Script:
    """Answer the n-th request of each connection with answers[n] (the last one repeats)."""

    async def script(peer: Peer) -> None:
        n = 0
        while await peer.read_request() is not None:
            peer.send(answers[min(n, len(answers) - 1)])
            n += 1

    return script
