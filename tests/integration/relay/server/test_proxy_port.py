"""The proxy port's own connection (sidecar/relay/server/proxy_port.py), over real sockets:
what it holds that aiohttp's connection handler used to (the header timer, the drain's wait,
a lost client), and the aiohttp parser API it is built on, pinned on the installed aiohttp."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from sidecar.app import ProxyRunner, build_sidecar
from sidecar.config import Settings
from tests.integration.relay.server.test_one_way_in import post, read_response, requests_counted
from tests.support.scripted_server import Peer, ScriptedServer
from tests.support.sse import CHUNKED_HEAD, DONE, chunked

pytestmark = pytest.mark.integration

PIECE = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def slow_stream(pieces: int, every: float):
    async def script(peer: Peer) -> None:
        while await peer.read_request() is not None:
            peer.send(CHUNKED_HEAD)
            for _ in range(pieces):
                await asyncio.sleep(every)
                peer.send(chunked(PIECE)[: -len(b"0\r\n\r\n")])
            peer.send(chunked(DONE))

    return script


class Port:
    """A sidecar's proxy port in this event loop, in front of a scripted upstream."""

    def __init__(self, script, **settings) -> None:
        self.script = script
        self.settings = settings

    async def __aenter__(self) -> Port:
        self.upstream = await ScriptedServer(self.script).start()
        self.sc = build_sidecar(
            Settings(upstream=self.upstream.url, **self.settings),
            CollectorRegistry(),
            access_log=False,
        )
        self.runner = ProxyRunner(self.sc, shutdown_timeout=1.0)
        await self.runner.setup()
        await self.runner.listen("127.0.0.1", 0)
        self.port = self.runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()

    def counted(self, outcome: str) -> float:
        return requests_counted(self.sc.registry, outcome)


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """The sidecar closed the connection (the end of what it sent came) within ``seconds``."""
    try:
        await asyncio.wait_for(reader.read(), seconds)
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def test_an_idle_kept_alive_connection_is_closed_after_the_header_timeout():
    async with Port(slow_stream(1, 0.01), client_header_timeout=0.3) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(post())
        assert b"[DONE]" in await read_response(reader)
        started = time.monotonic()
        assert await closed_within(reader, 3.0)  # no next head within 0.3 s of the answer
        assert 0.2 < time.monotonic() - started < 2.5
        writer.close()


async def test_a_stream_longer_than_the_header_timeout_is_never_cut_by_it():
    """The timer waits for a head, not for an answer: a 1.2 s stream through a port whose
    header timeout is 0.3 s arrives whole, and the connection then carries another request."""
    async with Port(slow_stream(6, 0.2), client_header_timeout=0.3) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        for _ in range(2):
            writer.write(post())
            answer = await asyncio.wait_for(read_response(reader), 5.0)
            assert answer.count(PIECE) == 6 and b"[DONE]" in answer
        writer.close()
    assert port.counted("ok") == 2


async def test_shutdown_closes_idle_connections_at_once_and_waits_for_an_answer():
    async with Port(slow_stream(3, 0.2)) as port:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(post())
        await asyncio.sleep(0.1)  # the stream has begun
        shutdown = asyncio.ensure_future(port.runner.port.shutdown(5.0))
        assert await closed_within(idle_reader, 1.0)  # the idle one at once
        answer = await asyncio.wait_for(read_response(reader), 5.0)
        assert answer.count(PIECE) == 3 and b"[DONE]" in answer  # the stream, whole
        assert await closed_within(reader, 2.0)  # then its connection closes
        await asyncio.wait_for(shutdown, 5.0)
        idle_writer.close()
        writer.close()
    assert port.counted("ok") == 1


async def test_shutdown_cuts_what_is_left_at_its_deadline_and_records_it_cancelled():
    async with Port(slow_stream(50, 0.2)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(post())
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await port.runner.port.shutdown(0.3)
        assert time.monotonic() - started < 2.0
        assert await closed_within(reader, 2.0)
        writer.close()
        for _ in range(50):
            if port.counted("cancelled") == 1:
                break
            await asyncio.sleep(0.02)
    assert port.counted("cancelled") == 1 and port.counted("ok") == 0


class _Reads:
    """What aiohttp's body streams ask of the protocol they read for."""

    connected = True

    def pause_reading(self) -> None: ...
    def resume_reading(self, resume_parser: bool = True) -> None: ...


async def test_the_parser_is_built_and_fed_as_the_installed_aiohttp_takes_it():
    """The arguments the proxy port gives aiohttp's request parser (C and Python), and what it
    calls on it: two pipelined requests, a body kept compressed, a refusal raised."""
    from aiohttp.http_exceptions import HttpProcessingError
    from aiohttp.http_parser import HttpRequestParserC, HttpRequestParserPy
    from aiohttp.web_protocol import RequestPayloadError

    loop = asyncio.get_running_loop()
    for kind in (HttpRequestParserC, HttpRequestParserPy):
        parser = kind(
            _Reads(), loop, 2**16, max_line_size=8190, max_field_size=8190, max_headers=128,
            payload_exception=RequestPayloadError, auto_decompress=False, max_msg_queue_size=32,
        )  # fmt: skip
        two = post(b"/v1/completions", b"\x1f\x8b", b"Content-Encoding: gzip") * 2
        messages, upgraded, _ = parser.feed_data(two)
        assert [m.path for m, _ in messages] == ["/v1/completions"] * 2 and not upgraded, kind
        assert messages[0][1].read_nowait() == b"\x1f\x8b"  # not decompressed
        parser.message_consumed()
        parser.message_consumed()
        parser.feed_eof()
        refusing = kind(_Reads(), loop, 2**16, max_msg_queue_size=32)
        with pytest.raises(HttpProcessingError):
            refusing.feed_data(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")


async def test_head_requests_get_heads_only_and_the_connection_carries_on():
    """A HEAD's answer has a Content-Length and no body: neither the relay nor the client
    waits for one, and the next request on the connection is answered."""

    async def script(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            body = b"" if request.startswith(b"HEAD ") else b"x" * 10
            peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-A: 1\r\n\r\n" + body)

    async with Port(script) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        for method in (b"HEAD", b"GET", b"HEAD"):
            writer.write(method + b" /health HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3.0)
            assert head == b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-A: 1\r\n\r\n"
            if method == b"GET":
                assert await asyncio.wait_for(reader.readexactly(10), 3.0) == b"x" * 10
        writer.close()
    relayed = [r.split(b" ")[0] for r in port.upstream.requests if b" /health " in r]
    assert relayed == [b"HEAD", b"GET", b"HEAD"]  # (not the sidecar's own model listing)
