"""A wire tap between the sidecar and a real server: what the server received and sent.

Comparing a request through the sidecar with a *separate* direct request proves nothing
exact about a real server whose answers vary (vLLM's API process merges a request's
tokens into fewer events whenever it falls behind, so two identical requests come back
split differently). The tap removes the guesswork: it is a plain TCP pipe on a free port,
the sidecar's upstream points at it, and it records every byte each way of every
connection. :func:`exchanges` parses those bytes with h11 (an HTTP/1.1 parser independent
of aiohttp and of the sidecar) into the requests the server received and the responses it
sent, so a test can assert that the client got exactly the server's bytes for *that*
request, and that the server got exactly the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import h11

_READ = 65536


@dataclass
class Recording:
    """The bytes of one tapped connection, each way, in order."""

    to_server: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)


@dataclass(frozen=True)
class Exchange:
    """One request the server received and the response it sent (bodies de-framed)."""

    method: str
    target: str
    request_headers: list[tuple[str, str]]
    request_body: bytes
    status: int
    response_headers: list[tuple[str, str]]
    response_body: bytes


class WireTap:
    """A TCP pipe to ``host:port`` that records both directions of every connection."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.recordings: list[Recording] = []
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.url = ""

    async def start(self) -> WireTap:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        recording = Recording()
        self.recordings.append(recording)
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            return
        pumps = [
            asyncio.create_task(_pump(client_r, server_w, recording.to_server)),
            asyncio.create_task(_pump(server_r, client_w, recording.to_client)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._tasks.difference_update(pumps)
            for writer in (client_w, server_w):
                writer.close()

    def exchanges(self) -> list[Exchange]:
        """Every complete exchange on every connection so far, in connection order."""
        return [
            x
            for recording in self.recordings
            for x in exchanges(bytes(recording.to_server), bytes(recording.to_client))
        ]


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, into: bytearray
) -> None:
    """Copy until EOF, recording each read before it is passed on (so the recording is
    complete by the time the other side has received the bytes)."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(_READ):
            into += data
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


def exchanges(to_server: bytes, to_client: bytes) -> list[Exchange]:
    """Parse one connection's bytes into its complete request/response exchanges.

    Two h11 state machines play the two ends: the server side reads the requests, the
    client side reads the responses; each is told what the other sent so both advance to
    the next request on a kept-alive connection. An exchange still in flight is left out."""
    server, client = h11.Connection(h11.SERVER), h11.Connection(h11.CLIENT)
    server.receive_data(to_server)
    client.receive_data(to_client)
    out: list[Exchange] = []
    while True:
        request = _message(server, h11.Request)
        if request is None:
            return out
        head, body = request
        client.send(h11.Request(method=head.method, target=head.target, headers=head.headers))
        if body:
            client.send(h11.Data(data=body))
        client.send(h11.EndOfMessage())
        response = _message(client, h11.Response)
        if response is None:
            return out
        reply, reply_body = response
        out.append(
            Exchange(
                method=head.method.decode(),
                target=head.target.decode(),
                request_headers=[(k.decode(), v.decode("latin-1")) for k, v in head.headers],
                request_body=body,
                status=reply.status_code,
                response_headers=[(k.decode(), v.decode("latin-1")) for k, v in reply.headers],
                response_body=reply_body,
            )
        )
        server.send(
            h11.Response(status_code=reply.status_code, headers=reply.headers, reason=reply.reason)
        )
        if reply_body:
            server.send(h11.Data(data=reply_body))
        server.send(h11.EndOfMessage())
        if server.our_state is not h11.DONE or client.our_state is not h11.DONE:
            return out  # the connection closes after this exchange
        server.start_next_cycle()
        client.start_next_cycle()


def _message(conn: h11.Connection, head_type: type) -> tuple[object, bytes] | None:
    """The next message's head and whole body, or None when it is not complete yet."""
    head, body = None, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
            return None
        if isinstance(event, h11.InformationalResponse):
            continue
        if isinstance(event, head_type):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return head, bytes(body)
