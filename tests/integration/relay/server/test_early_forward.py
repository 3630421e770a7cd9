"""A request sent upstream from the read that completed it (sidecar/relay/data/early.py), over real
sockets: the upstream gets exactly the bytes the handler's path sends, the requests the early
path must leave alone take the handler's path, and a client that goes before its handler ran
stops the upstream request and is counted once, as cancelled.

Each case runs through two sidecars in front of the same kind of scripted upstream (which
records every request byte for byte): one as served, one with the early path switched off
(the connection guard's ``early`` hook removed). A spy on the hook records what it did.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.app import RUNNER_KWARGS, SidecarRunner, build_sidecar
from sidecar.config import Settings
from tests.conftest import wait_for
from tests.support.scripted_server import Peer, ScriptedServer
from tests.support.sse import CHUNKED_HEAD, DONE, chunked

pytestmark = pytest.mark.integration

SSE = CHUNKED_HEAD + chunked(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n', DONE)
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'


def post(path: bytes = b"/v1/chat/completions", body: bytes = BODY, *extra: bytes, version: bytes = b"1.1") -> bytes:
    lines = b"".join(e + b"\r\n" for e in extra)
    return (
        b"POST %b HTTP/%b\r\nHost: sidecar.test\r\nContent-Type: application/json\r\n%bContent-Length: %d\r\n\r\n%b"
        % (path, version, lines, len(body), body)
    )


async def answer_all(peer: Peer) -> None:
    while await peer.read_request() is not None:
        peer.send(SSE)


class Side:
    """One sidecar in front of its own scripted upstream, with a spy on the early hook."""

    def __init__(self, early: bool, **settings) -> None:
        self.early = early
        self.settings = settings
        self.records: list[object] = []  # what the hook returned, per call

    async def __aenter__(self) -> Side:
        self.upstream = await ScriptedServer(answer_all).start()
        self.sc = build_sidecar(Settings(upstream=self.upstream.url, **self.settings), CollectorRegistry(), access_log=False)
        self.runner = SidecarRunner(self.sc.proxy_app, shutdown_timeout=1.0, **RUNNER_KWARGS)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        guard = self.runner.server.guard  # type: ignore[union-attr]
        hook = guard.early
        assert hook is not None  # the proxy port has the early path unless switched off

        def spy(message, payload, transport):
            record = hook(message, payload, transport)
            self.records.append(record)
            return record

        guard.early = spy if self.early else None
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()
        for peer in self.upstream.peers:
            peer.go.set()

    async def exchange(self, *requests: bytes, together: bool = False) -> list[bytes]:
        """Send the requests on one connection, one after the other's response (or all in one
        write); the raw responses."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        answers = []
        try:
            if together:
                writer.write(b"".join(requests))
                requests = tuple(b"" for _ in requests)
            for request in requests:
                if request:
                    writer.write(request)
                answers.append(await read_response(reader))
        finally:
            writer.close()
        return answers

    @property
    def relayed(self) -> list[bytes]:
        """What the upstream got from clients (not the sidecar's own model discovery), its
        port (which differs between the two sidecars' upstreams) written as PORT."""
        own = f":{self.upstream.port}".encode()
        return [r.replace(own, b":PORT") for r in self.upstream.requests if b"model-discovery" not in r]

    def counted(self, outcome: str) -> float:
        return sum(
            s.value
            for m in self.sc.registry.collect()
            if m.name == "llm_requests"
            for s in m.samples
            if s.name == "llm_requests_total" and s.labels.get("outcome") == outcome
        )


async def read_response(reader: asyncio.StreamReader) -> bytes:
    interim = b""
    head = await reader.readuntil(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 1"):  # an interim answer (100 Continue) before the response
        interim += head
        head = await reader.readuntil(b"\r\n\r\n")
    head = interim + head
    if b"transfer-encoding: chunked" in head.lower():
        return head + await reader.readuntil(b"\r\n0\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return head + await reader.readexactly(int(line.split(b":")[1]))
    return head + await reader.read()  # delimited by the close (an HTTP/1.0 client)


async def both(*requests: bytes, together: bool = False, **settings) -> tuple[Side, Side, list[bytes], list[bytes]]:
    async with Side(True, **settings) as on, Side(False, **settings) as off:
        answers_on = await on.exchange(*requests, together=together)
        answers_off = await off.exchange(*requests, together=together)
        await wait_for(lambda: len(on.relayed) == len(off.relayed), timeout=5.0)
    return on, off, answers_on, answers_off


FORWARDED = [
    pytest.param([post()], id="chat"),
    pytest.param(
        [
            post(
                b"/v1/chat/completions?api-version=2024-06-01",
                BODY,
                b"X-Forwarded-For: 10.0.0.1",
                b"x-forwarded-for: 10.0.0.2",
                b"Connection: keep-alive, X-Drop-Me",
                b"X-Drop-Me: 1",
                b"authorization: Bearer sk-test",
                b"X-Custom: a",
                b"X-Custom: b",
            )
        ],
        id="forwarded-for-connection-listed-query",
    ),
    pytest.param([post(b"/v1/completions", b'{"model":"m","prompt":"hi","stream":true}')], id="completions"),
]


@pytest.mark.parametrize("requests", FORWARDED)
async def test_the_upstream_gets_the_same_bytes_either_way(requests):
    # Twice on one connection: the first finds no idle upstream connection (a task connects
    # and sends it), the second takes the pooled one and is written from the read itself.
    on, off, answers_on, answers_off = await both(*requests, *requests)

    assert on.relayed == off.relayed and len(on.relayed) == 2
    assert answers_on == answers_off and all(a.endswith(b"0\r\n\r\n") and b"[DONE]" in a for a in answers_on)
    assert all(r is not None for r in on.records) and len(on.records) == 2
    assert on.records[0].pending is not None  # type: ignore[attr-defined]
    assert on.records[1].sent is not None  # type: ignore[attr-defined]
    assert on.counted("ok") == off.counted("ok") == 2


LEFT_TO_THE_HANDLER = [
    pytest.param([b"GET /v1/models HTTP/1.1\r\nHost: sidecar.test\r\n\r\n"], False, id="get"),
    pytest.param([post(b"/not/an/api", b"{}")], False, id="not-an-api-route"),
    pytest.param([post(body=b"")], False, id="no-body"),
    pytest.param([post(version=b"1.0")], False, id="http-1.0"),
    pytest.param(
        [
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar.test\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked(BODY)
        ],
        False,
        id="chunked-body",
    ),
    pytest.param([post(b"/v1/chat/completions", BODY, b"Expect: 100-continue")], False, id="expect"),
    pytest.param([post(), post()], True, id="pipelined"),
]


@pytest.mark.parametrize("requests,together", LEFT_TO_THE_HANDLER)
async def test_requests_the_early_path_leaves_to_the_handler(requests, together):
    on, off, answers_on, answers_off = await both(*requests, together=together)

    assert on.relayed == off.relayed and on.relayed
    assert [a.split(b"\r\n")[0] for a in answers_on] == [a.split(b"\r\n")[0] for a in answers_off]
    assert all(r is None for r in on.records)  # offered (or not even that) and declined


async def test_a_body_past_the_inspect_limit_is_left_to_the_handler():
    big = b'{"model":"m","prompt":"' + b"x" * 2048 + b'"}'
    on, off, _, _ = await both(post(b"/v1/completions", big), max_request_inspect_bytes=1024)
    assert on.relayed == off.relayed and on.records == [None]


async def test_no_early_path_while_draining():
    async with Side(True) as on:
        on.sc.drain.draining = True
        await on.exchange(post())
    assert on.records == [None]


async def test_a_client_gone_before_its_handler_ran_stops_the_upstream_request_and_counts_once():
    async with Side(True) as on:
        await on.exchange(post())  # a pooled upstream connection for the next one to take
        sock = socket.create_connection(("127.0.0.1", on.port))
        sock.sendall(post())
        sock.close()  # request and FIN together: aiohttp runs no handler for it
        await wait_for(lambda: on.counted("cancelled") == 1, timeout=5.0)
        await wait_for(lambda: len(on.relayed) == 2, timeout=5.0)  # it did reach the server
        upstream = next(p for p in on.upstream.peers if p.requests and p.requests[-1] == on.upstream.requests[-1])
        await asyncio.wait_for(upstream.eof.wait(), 5.0)  # and was stopped there
        await asyncio.sleep(0.05)
        assert on.counted("cancelled") == 1 and on.counted("ok") == 1
        assert on.records[1] is not None and on.records[1].sent is not None  # type: ignore[attr-defined]
