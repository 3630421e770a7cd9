"""The proxy port held to what nginx does in the same case, over real sockets: an upgrade
offer with a body, a pipeline behind a body that came late, a valid request before an
invalid one in one read, a reader that stopped, an early answer to a large upload, and the
smaller refusals (an HTTP/2 request line, a Host that is no host). Each case names what
nginx 1.22 (and aiohttp's own server, where it differs) does."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time

import aiohttp
import pytest

from sidecar.app import HEALTH_BODY_BYTES, build_sidecar
from sidecar.config import Settings
from tests.integration.relay.server.test_one_way_in import read_response
from tests.integration.relay.server.test_proxy_port import Port
from tests.support.raw import OWN_UA
from tests.support.scripted_server import Peer, response
from tests.support.sse import CHUNKED_HEAD, chunked

pytestmark = pytest.mark.integration

BODY = b'{"model":"m","prompt":"hi"}'
H2C = (
    b"Connection: Upgrade, HTTP2-Settings",
    b"Upgrade: h2c",
    b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
)
WEBSOCKET = (b"Connection: Upgrade", b"Upgrade: websocket", b"Sec-WebSocket-Version: 13")


def request(
    method: bytes, path: bytes, *fields: bytes, body: bytes | None = None, chunk: bool = False
) -> bytes:
    lines = b"".join(f + b"\r\n" for f in fields)
    if body is None:
        return b"%b %b HTTP/1.1\r\nHost: sidecar.test\r\n%b\r\n" % (method, path, lines)
    if chunk:
        framed = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
        return b"%b %b HTTP/1.1\r\nHost: sidecar.test\r\n%bTransfer-Encoding: chunked\r\n\r\n%b" % (
            method,
            path,
            lines,
            framed,
        )
    return b"%b %b HTTP/1.1\r\nHost: sidecar.test\r\n%bContent-Length: %d\r\n\r\n%b" % (
        method,
        path,
        lines,
        len(body),
        body,
    )


async def echo_path(peer: Peer) -> None:
    """Answers each whole request (its body read) with its request line."""
    while (raw := await peer.read_request()) is not None:
        peer.send(response(raw.split(b"\r\n", 1)[0]))


def relayed(port: Port) -> list[bytes]:
    """The requests the upstream got from clients (not the sidecar's own: health, listing)."""
    return [r for r in port.upstream.requests if OWN_UA not in r]


def field(head: bytes, name: bytes) -> bytes | None:
    m = re.search(rb"\r\n" + name + rb": *([^\r]*)", head, re.IGNORECASE)
    return m.group(1) if m else None


# -- an upgrade offer ------------------------------------------------------------------------


@pytest.mark.parametrize("offer", [H2C, WEBSOCKET], ids=["h2c", "websocket"])
@pytest.mark.parametrize("chunk", [False, True], ids=["length", "chunked"])
async def test_an_upgrade_offer_with_a_body_is_relayed_as_a_plain_request_with_its_body(
    offer, chunk
):
    """nginx (no upgrade mapping) drops the offer and relays the request with its body. The
    sidecar carries no upgraded protocol: the same, and the connection closes after."""
    async with Port(echo_path) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(request(b"POST", b"/v1/completions", *offer, body=BODY, chunk=chunk))
        answer = await asyncio.wait_for(read_response(reader), 5.0)
        rest = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        sent = relayed(port)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"POST /v1/completions HTTP/1.1")
    assert field(answer, b"connection") == b"close" and rest == b""
    assert len(sent) == 1 and sent[0].endswith(BODY + (b"\r\n0\r\n\r\n" if chunk else b""))
    assert field(sent[0], b"upgrade") is None and field(sent[0], b"http2-settings") is None


async def test_an_early_answer_to_an_upgrade_offer_never_takes_the_next_clients_request():
    """An upstream that answers on the head (vLLM's --api-key check, a 404) and then reads
    the body the head declared: had the sidecar sent the head alone, the upstream would
    read the next request on the pooled connection as that body."""

    async def early(peer: Peer) -> None:
        while (head := await peer.read_head()) is not None:
            line = head.split(b"\r\n", 1)[0]
            peer.send(response(line, b"401 Unauthorized"))
            length = field(head, b"content-length")
            if length:
                await peer.reader.readexactly(int(length))  # drained, as a server does
            peer.requests.append(head)

    async with Port(early) as port:
        answers = []
        for raw in (
            request(b"POST", b"/v1/completions", *H2C, body=b"x" * 40),
            request(b"POST", b"/v1/chat/completions", body=BODY),
            request(b"GET", b"/v1/models"),
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
            writer.write(raw)
            answers.append(await asyncio.wait_for(read_response(reader), 5.0))
            writer.close()
        seen = [head.split(b"\r\n", 1)[0] for head in relayed(port)]
    assert [a.split(b"\r\n\r\n", 1)[1] for a in answers] == [
        b"POST /v1/completions HTTP/1.1",
        b"POST /v1/chat/completions HTTP/1.1",
        b"GET /v1/models HTTP/1.1",
    ]
    assert seen == [a.split(b"\r\n\r\n", 1)[1] for a in answers]


# -- pipelining ------------------------------------------------------------------------------


async def test_a_pipeline_behind_a_body_that_came_in_a_later_read_is_all_answered():
    """aiohttp's parser counts a request when its body ends; a slot given back before that
    was lost, and the parser stopped at 31 while the queue waited for 32. nginx answers all."""
    async with Port(echo_path, client_header_timeout=3.0) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        head, _, body = request(b"POST", b"/upload", body=b"y" * 10).partition(b"\r\n\r\n")
        writer.write(head + b"\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        gets = b"".join(request(b"GET", b"/n%d" % i) for i in range(40))
        writer.write(body + gets)
        answers = [await asyncio.wait_for(read_response(reader), 5.0) for _ in range(41)]
        writer.close()
    lines = [a.split(b"\r\n\r\n", 1)[1] for a in answers]
    assert lines == [b"POST /upload HTTP/1.1"] + [b"GET /n%d HTTP/1.1" % i for i in range(40)]


async def test_a_valid_request_before_an_invalid_one_in_the_same_read_is_answered_first():
    """nginx answers /a, then 400 for the bytes after it; a refusal used to replace every
    request its read completed."""
    async with Port(echo_path) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(request(b"GET", b"/a") + b"GET /b HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        first = await asyncio.wait_for(read_response(reader), 5.0)
        second = await asyncio.wait_for(read_response(reader), 5.0)
        rest = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        sent = relayed(port)
    assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"GET /a HTTP/1.1")
    assert second.startswith(b"HTTP/1.1 400 ") and b'"bad_request"' in second
    assert rest == b"" and len(sent) == 1


# -- a reader that stopped -------------------------------------------------------------------


def fast_stream(state: dict):
    """Streams 8 KiB events as fast as the sidecar takes them; ``state['closed']`` is when
    the sidecar closed the upstream request."""

    async def script(peer: Peer) -> None:
        raw = await peer.read_request()
        if raw is None or not raw.startswith(b"POST "):  # the sidecar's own: health, listing
            peer.send(response(b"", b"404 Not Found"))
            return
        peer.send(CHUNKED_HEAD)
        event = b"data: " + b"z" * 8192 + b"\n\n"
        try:
            while not peer.writer.is_closing():
                peer.send(chunked(event)[: -len(b"0\r\n\r\n")])
                await peer.writer.drain()
                await asyncio.sleep(0.002)
        except ConnectionError:
            pass
        await peer.read_to_eof()
        state["closed"] = time.monotonic()

    return script


@pytest.mark.parametrize("send_timeout", [2.0, 4.0])
async def test_a_reader_that_stopped_is_let_go_within_send_timeout_of_its_last_byte(
    send_timeout,
):
    """nginx's send_timeout counts from the last byte the client took. Granting a whole new
    window for each window with any progress held a reader that stopped for up to twice the
    timeout: its kernel still took bytes early in the window that began as the upstream
    was paused, so a second window was granted."""
    state: dict = {}
    async with Port(fast_stream(state), send_timeout=send_timeout) as port:
        sock = socket.socket()
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", port.port))
        await loop.sock_sendall(sock, request(b"POST", b"/v1/completions", body=BODY))
        got = 0
        while got < 4 << 20:  # reads as it comes, then stops
            got += len(await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 5.0))
        stopped = time.monotonic()  # its kernel's buffer fills within milliseconds: its last byte
        while "closed" not in state and time.monotonic() - stopped < 3 * send_timeout:
            await asyncio.sleep(0.05)
        sock.close()
    assert "closed" in state, "the upstream request was never closed"
    held = state["closed"] - stopped
    assert send_timeout - 0.3 <= held <= send_timeout + 1.0, held


# -- an early answer to a large upload -------------------------------------------------------


async def test_an_early_answer_to_a_large_upload_reaches_a_client_that_writes_it_all_first():
    """A 32 MiB upload the server refuses on its head (401) and drains, from a client that
    writes its whole body before it reads (requests, http.client): nginx reads and throws
    away the rest, answers, then closes. The rest used to fill a reader nobody emptied."""

    async def refuse_on_head(peer: Peer) -> None:
        head = await peer.read_head()
        assert head is not None
        peer.send(response(b"no", b"401 Unauthorized"))
        await peer.read_to_eof()  # drains what the sidecar still sends

    size = 32 << 20
    async with Port(refuse_on_head, client_header_timeout=30.0) as port:
        result: dict = {}

        def client() -> None:  # blocking, as http.client is
            with socket.create_connection(("127.0.0.1", port.port), timeout=20) as s:
                s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
                try:
                    s.sendall(b"u" * size)
                except OSError as exc:
                    result["send_error"] = exc
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
                result["answer"] = data

        thread = threading.Thread(target=client)
        started = time.monotonic()
        thread.start()
        while thread.is_alive() and time.monotonic() - started < 25:
            await asyncio.sleep(0.05)
        thread.join(1)
    assert not thread.is_alive(), "the client never got an answer"
    assert "send_error" not in result, result.get("send_error")
    assert result["answer"].startswith(b"HTTP/1.1 401 ") and result["answer"].endswith(b"no")


# -- smaller refusals ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET /v1/models HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        (b"GET /v1/models HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
    ],
    ids=["http2-request-line", "host-with-space", "host-with-path"],
)
async def test_requests_nginx_refuses_are_refused_and_never_relayed(raw, status):
    async with Port(echo_path) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(raw)
        answer = await asyncio.wait_for(read_response(reader), 5.0)
        writer.close()
        sent = relayed(port)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer
    assert sent == []


# -- the readiness probe's read ----------------------------------------------------------------


async def test_the_readiness_probe_reads_a_huge_health_answer_only_up_to_its_bound():
    """The probe wants the status; a 200 MiB health body (a misrouted path, a hostile
    upstream) used to be read whole into memory on every /readyz."""
    written = 0
    size = 200 << 20

    async def huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        block = b"h" * (1 << 20)
        try:
            while written < size:
                writer.write(block)
                await writer.drain()
                written += len(block)
        except ConnectionError:
            pass
        writer.close()

    server = await asyncio.start_server(huge, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        sc = build_sidecar(Settings(upstream=f"http://127.0.0.1:{port}"))
        async with asyncio.timeout(10), aiohttp.ClientSession() as session:
            status = await sc.upstream_status(session)
        await asyncio.sleep(0.2)
    finally:
        server.close()
    assert status == 200
    assert HEALTH_BODY_BYTES < 1 << 20
    assert written < 16 << 20, written  # what the kernel's buffers held, not the body
