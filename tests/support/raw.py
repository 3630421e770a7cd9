"""Raw-socket peers and clients: an upstream that records every byte it receives, one that
reads bodies whole, and clients that send or read bytes an HTTP library would refuse to.

Raw on purpose: what the test does not read stays in the kernel, and what the upstream
records is exactly what the sidecar wrote.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.sse import CHUNKED_HEAD, DONE, LAST_CHUNK, http_chunk

OWN_UA = b"\r\nUser-Agent: llm-sidecar"  # the sidecar's own requests: health, model listing


# -- upstreams --------------------------------------------------------------------------------------


class RawUpstream:
    """Accepts connections, records what arrives, answers each complete request with
    ``response`` and closes. ``requests`` holds the raw bytes received per connection."""

    def __init__(
        self,
        response: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    ) -> None:
        self.response = response
        self.received: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None

    @property
    def requests(self) -> list[bytes]:
        """What the clients' relayed requests brought, without the sidecar's own background
        requests (health probes, its model listing) and connections that brought nothing."""
        return [r for r in self.received if r and OWN_UA not in r]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> RawUpstream:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    @staticmethod
    def _complete(data: bytes) -> bool:
        head, sep, body = data.partition(b"\r\n\r\n")
        if not sep:
            return False
        headers = head.lower()
        m = re.search(rb"\r\ncontent-length: *(\d+)", headers)
        if m:
            return len(body) >= int(m.group(1))
        if b"\r\ntransfer-encoding: chunked" in headers:
            return body.endswith(b"0\r\n\r\n")
        return True

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        index = len(self.received)
        self.received.append(b"")
        try:
            while not self._complete(data):
                chunk = await asyncio.wait_for(reader.read(65536), 5)
                if not chunk:
                    return
                data += chunk
                self.received[index] = data
            writer.write(self.response)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw_upstream():
    made: list[RawUpstream] = []

    async def make(**kwargs) -> RawUpstream:
        up = await RawUpstream(**kwargs).start()
        made.append(up)
        return up

    yield make
    for up in made:
        await up.close()


class BodyReadingUpstream:
    """Reads each request's body whole (recording its size in ``received``), then answers a
    short SSE stream: ``event``, and after it ``[DONE]``. With ``hold``, the stream waits
    after ``event`` until the test sets ``finish``, so the sidecar's memory can be read
    while the stream is in flight (``in_stream`` is set once ``event`` is written)."""

    def __init__(
        self,
        event: bytes = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n',
        hold: bool = False,
    ) -> None:
        self.event = event
        self.hold = hold
        self.received: list[int] = []
        self.in_stream = asyncio.Event()
        self.finish = asyncio.Event()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                got = 0
                while got < length:
                    data = await reader.read(min(1 << 20, length - got))
                    if not data:
                        return
                    got += len(data)
                self.received.append(got)
                writer.write(CHUNKED_HEAD + http_chunk(self.event))
                self.in_stream.set()
                if self.hold:
                    await self.finish.wait()
                writer.write(http_chunk(DONE) + LAST_CHUNK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


# -- clients ----------------------------------------------------------------------------------------


async def raw_exchange(port: int, data: bytes, wait: float = 2.0) -> bytes:
    """Send raw bytes, read until the sidecar closes the connection (or ``wait`` passes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = b""
    try:
        async with asyncio.timeout(wait):
            while chunk := await reader.read(65536):
                out += chunk
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    return out


def status_and_json(raw: bytes) -> tuple[int, dict, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body), head


async def post_raw(
    port: int, path: bytes, body: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST ``body`` (any bytes, MiBs of them) in 1 MiB writes; the response is the test's to read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (path, len(body))
    )
    view = memoryview(body)
    for i in range(0, len(body), 1 << 20):
        writer.write(view[i : i + (1 << 20)])
        await writer.drain()
    return reader, writer


TCP_ESTABLISHED = 1


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of a socket (``tcpi_state``, the first byte of TCP_INFO)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


async def raw_socket(port: int, rcvbuf: int = 4096) -> socket.socket:
    """A connected non-blocking socket with a small receive buffer. Raw, with no reader
    buffering on our side: what the test does not recv stays in the kernel, so the sidecar
    sees exactly the reading the test does."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


@contextmanager
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 another socket listens on for the block's duration."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]
