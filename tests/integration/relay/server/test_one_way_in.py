"""The relay's one way in (sidecar/relay/data/exchange.py), over real sockets: every request
on the proxy port is answered from the connection's own callbacks (aiohttp's handler
machinery never runs there), and the upstream gets exactly the bytes aiohttp's handler sent
when it answered what the relay did not carry (recorded from it before it was removed:
door_exchanges.json, beside it); a client that goes stops the upstream request and
is counted once, as cancelled.

The same holds for a head and its body that arrive in separate reads (httpx writes them
apart): the head is taken off aiohttp's queue at once and its body is awaited by the
exchange, whenever it comes.

Each case runs through a sidecar in front of a scripted upstream (which records every
request byte for byte). A spy on the connection guard's ``carry`` hook records each exchange,
and one on aiohttp's ``RequestHandler._handle_request`` counts the requests aiohttp's own
handler answered: none.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sidecar.app import ProxyRunner, build_sidecar
from sidecar.config import Settings
from sidecar.relay.control.self_loop import LOOP_HEADER, LOOP_TOKEN
from sidecar.relay.server.aiohttp_internals import RequestHandler
from sidecar.relay.server.proxy_port import ProxyConnection
from tests.support.scripted_server import Peer, ScriptedServer
from tests.support.sse import CHUNKED_HEAD, DONE, chunked
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

SSE = CHUNKED_HEAD + chunked(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n', DONE)
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'


def post(
    path: bytes = b"/v1/chat/completions",
    body: bytes = BODY,
    *extra: bytes,
    version: bytes = b"1.1",
) -> bytes:
    lines = b"".join(e + b"\r\n" for e in extra)
    return (
        b"POST %b HTTP/%b\r\nHost: sidecar.test\r\nContent-Type: application/json\r\n%bContent-Length: %d\r\n\r\n%b"
        % (path, version, lines, len(body), body)
    )


async def answer_all(peer: Peer) -> None:
    while await peer.read_request() is not None:
        peer.send(SSE)


class Side:
    """One sidecar in front of its own scripted upstream, with a spy on the ``carry`` hook and
    a count of the requests aiohttp's own handler answered (``handled``: there must be none)."""

    def __init__(self, tracer_provider=None, **settings) -> None:
        self.tracer_provider = tracer_provider
        self.settings = settings
        self.records: list[object] = []  # the exchange the hook made, per request
        self.handled = 0  # requests aiohttp's handler answered

    async def __aenter__(self) -> Side:
        self.upstream = await ScriptedServer(answer_all).start()
        self.sc = build_sidecar(
            Settings(upstream=self.upstream.url, **self.settings), CollectorRegistry(), access_log=False,
            tracer_provider=self.tracer_provider,
        )  # fmt: skip
        self.runner = ProxyRunner(self.sc, shutdown_timeout=1.0)
        await self.runner.setup()
        await self.runner.listen("127.0.0.1", 0)
        self.port = self.runner.addresses[0][1]
        guard = self.runner.guard
        hook = guard.carry
        assert hook is not None  # the proxy port's relay

        def spy(connection, message, payload):
            record = hook(connection, message, payload)
            self.records.append(record)
            return record

        guard.carry = spy
        handle = RequestHandler._handle_request
        side = self

        async def handled(handler, *args, **kwargs):  # aiohttp's task answering a request
            side.handled += 1
            return await handle(handler, *args, **kwargs)

        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(RequestHandler, "_handle_request", handled)
        return self

    async def __aexit__(self, *exc) -> None:
        self._patch.undo()
        await self.runner.cleanup()
        for peer in self.upstream.peers:
            peer.go.set()

    async def exchange(
        self, *requests: bytes | tuple[bytes, ...], together: bool = False
    ) -> list[bytes]:
        """Send the requests on one connection, one after the other's response (or all in one
        write; a request given as parts is read by the sidecar in as many reads,
        :func:`write_apart`); the raw responses."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        answers = []
        try:
            if together:
                writer.write(b"".join(requests))
                requests = tuple(b"" for _ in requests)
            for request in requests:
                if isinstance(request, tuple):  # its parts read apart by the sidecar
                    await write_apart(writer, *request)
                elif request:
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
        return [
            r.replace(own, b":PORT") for r in self.upstream.requests if b"model-discovery" not in r
        ]

    def counted(self, outcome: str) -> float:
        return requests_counted(self.sc.registry, outcome)


def requests_counted(registry: CollectorRegistry, outcome: str) -> float:
    """``llm_requests_total`` with ``outcome``, summed over its other labels."""
    return sum(
        s.value
        for m in registry.collect()
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


async def through(
    *requests: bytes | tuple[bytes, ...], together: bool = False, **settings
) -> tuple[Side, list[bytes]]:
    """The requests on one connection through a sidecar made with ``settings``; the side,
    once closed, and the raw answers."""
    async with Side(**settings) as side:
        answers = await side.exchange(*requests, together=together)
        await asyncio.sleep(0.05)  # anything sent upstream has arrived
    return side, answers


DOOR = json.loads((Path(__file__).with_name("door_exchanges.json")).read_text())


def _bytes(texts: list[str]) -> list[bytes]:
    return [t.encode("latin-1") for t in texts]


def own_answer(answer: bytes) -> tuple[bytes, bytes, bool]:
    """A sidecar-made answer as what a client acts on: its status code, its JSON body and
    whether the connection closes after it (aiohttp's own answers had Date and Server too)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    interim = b""
    while head.startswith(b"HTTP/1.1 1"):
        interim = head
        head, _, body = body.partition(b"\r\n\r\n")
    lower = head.lower()
    closes = b"connection: close" in lower or (
        head.startswith(b"HTTP/1.0 ") and b"connection: keep-alive" not in lower
    )
    return head.split(b" ")[1] + interim[:12], body, closes


CLOSES_NOW = {"upgrade"}
"""Cases whose answer now says ``Connection: close`` (a hop-by-hop field, the sidecar's to
set): past an ``Upgrade`` head aiohttp's parser reads no further request on the connection,
so the connection closes after the answer, and the client is told so."""


@pytest.mark.parametrize("case", sorted(DOOR["cases"]))
async def test_the_upstream_gets_the_bytes_aiohttps_handler_sent(case):
    """Every kind of request aiohttp's handler answered before the relay answered them all
    (bodies none, held or streamed, chunked, ``Expect``, HTTP/1.0, absolute forms, refusals,
    pipelining): the upstream gets the same bytes and the client the same answer."""
    recorded = DOOR["cases"][case]
    side, answers = await through(
        *_bytes(recorded["requests"]), together=recorded["together"], **recorded["settings"]
    )
    assert side.relayed == _bytes(recorded["relayed"])
    want = _bytes(recorded["answers"])
    assert len(answers) == len(want)
    for got, was in zip(answers, want, strict=True):
        if b"X-LLM-Sidecar-Error" in was:  # the sidecar's own answer
            assert own_answer(got) == own_answer(was)
        elif case in CLOSES_NOW:
            head, _, body = was.partition(b"\r\n\r\n")
            assert got == head + b"\r\nConnection: close\r\n\r\n" + body
        else:  # the upstream's, relayed
            assert got == was
    assert side.handled == 0  # one way in: aiohttp's handler never ran
    assert len(side.records) == len(want)  # each request was the relay's


async def test_a_request_is_sent_on_a_new_connection_then_on_the_pooled_one():
    """Twice on one connection: the first finds no idle upstream connection (a task connects
    and sends it), the second takes the pooled one and is written from the read itself."""
    side, answers = await through(post(), post())
    assert all(a.endswith(b"0\r\n\r\n") and b"[DONE]" in a for a in answers)
    assert not side.records[0].asked.written_at_once  # type: ignore[attr-defined]
    assert side.records[1].asked.written_at_once  # type: ignore[attr-defined]
    assert side.counted("ok") == 2 and side.handled == 0


async def test_pipelined_requests_are_each_carried_and_answered_in_order():
    """Three requests in one write: each is carried once the one before it is answered and
    taken, never two at once, and the answers come in the order asked."""
    bodies = [b'{"model":"m","prompt":"%d","stream":true}' % i for i in range(3)]
    requests = [post(b"/v1/completions", body) for body in bodies]
    side, answers = await through(*requests, together=True)

    assert [r.endswith(b) for r, b in zip(side.relayed, bodies, strict=True)] == [True] * 3
    assert len(answers) == 3 and all(a.endswith(b"0\r\n\r\n") for a in answers)
    assert len(side.records) == 3 and side.handled == 0


GET_MODELS = b"GET /v1/models HTTP/1.1\r\nHost: sidecar.test\r\n\r\n"


async def test_more_pipelined_requests_than_aiohttps_queue_holds_are_each_answered_in_order():
    """aiohttp stops reading a connection whose queue of parsed requests is full (32): the
    relay takes them off that queue, so it must resume reading as aiohttp's own task would,
    or the 33rd request would never be read."""
    bodies = [b'{"model":"m","prompt":"%d","stream":true}' % i for i in range(45)]
    requests = [post(b"/v1/completions", body) for body in bodies]
    async with Side() as on:
        answers = await asyncio.wait_for(on.exchange(*requests, together=True), 20.0)
        posts = lambda: [r for r in on.relayed if r.startswith(b"POST ")]  # noqa: E731
        await wait_for(lambda: len(posts()) == 45, timeout=5.0)
        await asyncio.sleep(0.1)  # and no more
        assert [r.endswith(b) for r, b in zip(posts(), bodies, strict=True)] == [True] * 45
    assert len(answers) == 45 and all(a.endswith(b"0\r\n\r\n") for a in answers)
    assert on.handled == 0 and len(on.records) == 45


async def test_a_parse_error_behind_a_carried_request_is_answered_in_its_turn():
    """A request, then in the next read bytes aiohttp's parser refuses, while the request is
    being answered: it is answered first, then the refusal (400, the sidecar's JSON), and the
    connection closes. (In one read, aiohttp's parser would refuse both.)"""
    async with Side() as on:
        reader, writer = await asyncio.open_connection("127.0.0.1", on.port)
        bad = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"
        await write_apart(writer, post(), bad)
        first = await read_response(reader)
        second = await read_response(reader)
        rest = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
    assert first.startswith(b"HTTP/1.1 200 ") and b"[DONE]" in first
    assert second.startswith(b"HTTP/1.1 400 ") and b'"type":"bad_request"' in second
    assert rest == b"" and len(on.relayed) == 1 and on.handled == 0


async def test_a_streamed_body_past_the_limit_is_cut_off_upstream_and_answered_413():
    """A chunked body that grows past ``max_request_body_bytes`` as it streams: the upstream
    never gets a complete request, the client gets 413, recorded ok with its 4xx code."""
    async with Side(max_request_body_bytes=64) as on:
        reader, writer = await asyncio.open_connection("127.0.0.1", on.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: sidecar.test\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"20\r\n"
            + b"x" * 32
            + b"\r\n"
        )
        await asyncio.sleep(0.1)
        writer.write(b"40\r\n" + b"y" * 64 + b"\r\n")
        answer = await read_response(reader)
        writer.close()
        await wait_for(lambda: on.counted("ok") == 1, timeout=5.0)
    assert answer.startswith(b"HTTP/1.1 413 ") and b"request_too_large" in answer
    assert all(not r.endswith(b"0\r\n\r\n") for r in on.upstream.requests)
    assert on.handled == 0


@pytest.mark.parametrize(
    "path", [b"/v1/chat/completions", b"/not/an/api"], ids=["held", "streamed"]
)
async def test_a_compressed_body_reaches_the_upstream_as_the_client_sent_it(path):
    """``Content-Encoding: gzip`` is the client's and the server's business: the upstream gets
    the compressed bytes under the client's header, never the body decompressed."""
    import gzip

    packed = gzip.compress(BODY)
    side, answers = await through(post(path, packed, b"Content-Encoding: gzip"))
    assert answers[0].startswith(b"HTTP/1.1 200 ")
    (relayed,) = side.relayed
    head, _, body = relayed.partition(b"\r\n\r\n")
    assert body == packed and b"Content-Encoding: gzip" in head
    assert b"Content-Length: %d" % len(packed) in head


@pytest.mark.parametrize("apart", [False, True], ids=["body-with-head", "body-read-apart"])
async def test_the_sidecars_own_request_come_back_is_508_and_never_sent_upstream(apart):
    """One loop check: a POST to an API route carrying this process's loop token (its own
    probe, come back through a forwarder) is refused before anything goes upstream, whichever
    read completed it: 508, and the connection closes."""
    looped = post(b"/v1/chat/completions", BODY, f"{LOOP_HEADER}: {LOOP_TOKEN}".encode())
    head, body = looped.split(b"\r\n\r\n", 1)
    request = (head + b"\r\n\r\n", body) if apart else looped
    async with Side() as side:
        await side.exchange(post())  # leaves an idle pooled upstream connection
        answers = await side.exchange(request)
        await asyncio.sleep(0.3)  # a request sent would have arrived by now
        assert answers[0].startswith(b"HTTP/1.1 508 ")
        assert b'"type":"upstream_loop"' in answers[0].replace(b" ", b"")
        assert b"connection: close" in answers[0].lower()
        assert len(side.relayed) == 1 and LOOP_TOKEN.encode() not in side.relayed[0]
        assert side.counted("ok") == 1  # the refused one is not an LLM request


@pytest.mark.parametrize("split", [False, True], ids=["body-with-head", "body-read-apart"])
async def test_while_draining_each_answer_closes_its_connection(split):
    """Drain step 1: requests are still relayed, and each answer says the connection closes,
    so a pooling client opens its next one through the Service, to a pod not stopping."""
    async with Side() as on:
        on.sc.drain.draining = True
        answers = await on.exchange(apart(post()) if split else post())
    assert answers[0].startswith(b"HTTP/1.1 200 ") and b"connection: close" in answers[0].lower()
    assert len(on.relayed) == 1 and on.handled == 0


async def test_once_the_upstream_is_gone_while_draining_a_new_request_is_503_and_not_sent():
    async with Side() as on:
        on.sc.drain.draining = on.sc.drain.refusing = True
        answers = await on.exchange(post())
    assert answers[0].startswith(b"HTTP/1.1 503 ") and b'"draining"' in answers[0]
    assert b"retry-after: 1" in answers[0].lower() and b"connection: close" in answers[0].lower()
    assert on.relayed == [] and on.counted("ok") == 0


async def test_a_client_gone_with_its_request_sent_stops_the_upstream_request_and_counts_once():
    async with Side() as on:
        await on.exchange(post())  # a pooled upstream connection for the next one to take
        sock = socket.create_connection(("127.0.0.1", on.port))
        sock.sendall(post())
        sock.close()  # request and FIN together
        await sent_then_stopped_and_counted_once(on)


async def sent_then_stopped_and_counted_once(on: Side) -> None:
    """The second request on ``on`` (its client gone) reached the server, was stopped there
    (the upstream connection closed) and is counted once, as cancelled."""
    await wait_for(lambda: on.counted("cancelled") == 1, timeout=5.0)
    await wait_for(lambda: len(on.relayed) == 2, timeout=5.0)
    upstream = next(
        p for p in on.upstream.peers if p.requests and p.requests[-1] == on.upstream.requests[-1]
    )
    await asyncio.wait_for(upstream.eof.wait(), 5.0)
    await asyncio.sleep(0.05)
    assert on.counted("cancelled") == 1 and on.counted("ok") == 1
    assert on.records[1] is not None and on.records[1].asked.written_at_once  # type: ignore[attr-defined]


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]"], ids=["not-json", "not-an-object"])
@pytest.mark.parametrize("tracing", [False, True], ids=["untraced", "traced"])
async def test_a_gone_clients_request_whose_body_has_no_fields_is_recorded(body, tracing, spans):
    """A body that is not a JSON object has no fields to label with: a carried request whose
    client left once it was sent is recorded all the same, and with tracing on its span ends."""
    provider, exporter = spans
    async with Side(tracer_provider=provider if tracing else None) as on:
        await on.exchange(post())  # a pooled upstream connection for the next one to take
        sock = socket.create_connection(("127.0.0.1", on.port))
        sock.sendall(post(body=body))
        sock.close()
        await wait_for(lambda: on.counted("cancelled") == 1, timeout=5.0)
        assert on.records[1] is not None and on.records[1].asked.written_at_once  # type: ignore[attr-defined]
        if tracing:
            await wait_for(lambda: len(exporter.get_finished_spans()) == 2, timeout=5.0)
            gone = exporter.get_finished_spans()[1]
            assert gone.attributes["llm_sidecar.outcome"] == "cancelled"


async def test_with_tracing_on_the_span_goes_upstream_and_a_gone_client_ends_it_cancelled(spans):
    """Tracing on: a carried request goes with this span's context (the upstream joins the
    client's trace as the span's child), and a client that went once it was sent still ends
    its span, as cancelled."""
    provider, exporter = spans
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traced = post(
        b"/v1/chat/completions",
        BODY,
        b"traceparent: 00-%s-%s-01" % (client_trace.encode(), client_span.encode()),
    )
    async with Side(tracer_provider=provider) as on:
        await on.exchange(traced)  # (and a pooled upstream connection for the next one to take)
        assert on_its_way(on.records[0])
        await wait_for(lambda: len(exporter.get_finished_spans()) == 1, timeout=5.0)
        sock = socket.create_connection(("127.0.0.1", on.port))
        sock.sendall(traced)
        sock.close()  # request and FIN together
        await wait_for(lambda: len(exporter.get_finished_spans()) == 2, timeout=5.0)
        assert on.records[1] is not None and on.records[1].asked.written_at_once  # type: ignore[attr-defined]
    first, gone = exporter.get_finished_spans()
    for span, request in zip((first, gone), on.upstream.requests[-2:], strict=True):
        assert span.context.trace_id == int(client_trace, 16)
        assert span.parent is not None and span.parent.span_id == int(client_span, 16)
        own = b"traceparent: 00-%s-%016x-01" % (client_trace.encode(), span.context.span_id)
        assert own in request.lower(), request  # the upstream's parent is this span
    assert first.attributes["llm_sidecar.outcome"] == "ok"
    assert gone.attributes["llm_sidecar.outcome"] == "cancelled"


# A head and its body in separate reads (httpx, and so the openai SDK, writes them apart: over
# a network they often arrive apart). The head is carried at once; the read that completes the
# body sends the request.


async def write_apart(writer: asyncio.StreamWriter, first: bytes, *rest: bytes) -> None:
    """Write ``first``, then each of ``rest`` right after the sidecar (on this event loop) has
    read the part before, in the same loop turn, so that each part is a read of its own and the
    next comes one turn later, as a body written just after its head arrives over a network.
    How: the loop runs the sockets a poll found ready in the order they became ready (epoll's
    ready list), so a callback on a socket pair poked just after a part was written runs right
    after the sidecar's read of that part, and writes the next."""
    loop = asyncio.get_running_loop()
    poked, poke = socket.socketpair()
    parts = list(rest)
    done = loop.create_future()

    def next_part() -> None:
        poked.recv(1)
        writer.write(parts.pop(0))
        if parts:
            poke.send(b".")
        else:
            loop.remove_reader(poked)
            done.set_result(None)

    loop.add_reader(poked, next_part)
    writer.write(first)
    poke.send(b".")
    try:
        await asyncio.wait_for(done, 5.0)
    finally:
        loop.remove_reader(poked)
        poked.close()
        poke.close()


def apart(request: bytes, *cuts: int) -> tuple[bytes, ...]:
    """``request`` as its head, then its body (cut after each of ``cuts`` bytes of it)."""
    end = request.index(b"\r\n\r\n") + 4
    head, body = request[:end], request[end:]
    bounds = [0, *cuts, len(body)]
    return (head, *(body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)))


async def head_then_body(side: Side, request: bytes, between) -> bytes:
    """``request``'s head, then ``await between(reader)``, then its body on one connection;
    the raw response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", side.port)
    head, body = apart(request)
    writer.write(head)
    await between(reader)
    writer.write(body)
    answer = await read_response(reader)
    writer.close()
    return answer


@pytest.fixture
def reads(monkeypatch) -> dict[int, list[int]]:
    """The size of every read each sidecar's proxy port got, by the port: the proof that a
    test's parts did arrive apart (only watched, never changed)."""
    seen: dict[int, list[int]] = {}
    received = ProxyConnection.data_received

    def watched(self, data: bytes) -> None:
        if data and self.transport is not None:
            seen.setdefault(self.transport.get_extra_info("sockname")[1], []).append(len(data))
        received(self, data)

    monkeypatch.setattr(ProxyConnection, "data_received", watched)
    return seen


def on_its_way(record) -> bool:
    """The hook carried it, and it went upstream (on a pooled connection, or a task connecting)."""
    return record is not None and record.asked is not None


def recorded(case: str) -> tuple[list[bytes], list[bytes]]:
    """What the upstream got and the client was answered in a recorded case (DOOR)."""
    door = DOOR["cases"][case]
    return _bytes(door["relayed"]), _bytes(door["answers"])


APART = [
    pytest.param("chat-twice", id="chat"),
    pytest.param(
        "forwarded-for-connection-listed-query", id="forwarded-for-connection-listed-query"
    ),
    pytest.param("completions-twice", id="completions"),
]


@pytest.mark.parametrize("case", APART)
async def test_a_body_read_after_its_head_goes_upstream_from_that_read_with_the_same_bytes(
    case, reads
):
    # Twice on one connection: a task connects for the first, the second is written at once.
    relayed, answers = recorded(case)
    request = apart(_bytes(DOOR["cases"][case]["requests"])[0])
    side, got = await through(request, request)

    assert reads[side.port] == [len(request[0]), len(request[1])] * 2  # apart
    assert side.relayed == relayed and got == answers
    assert len(side.records) == 2 and all(on_its_way(r) for r in side.records)
    assert not side.records[0].asked.written_at_once  # type: ignore[attr-defined]
    assert side.records[1].asked.written_at_once  # type: ignore[attr-defined]
    assert side.counted("ok") == 2 and side.handled == 0


class SplitHop:
    """A TCP hop in front of a sidecar on this event loop, for a real client: each request it
    gets reaches the sidecar as its head and then its body in the next read
    (:func:`write_apart`), as httpx's two writes often arrive over a network; the answers go
    back as they are."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> SplitHop:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _connection(
        self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter
    ) -> None:
        sidecar, to_sidecar = await asyncio.open_connection("127.0.0.1", self.port)
        back = asyncio.ensure_future(self._answers(sidecar, to_client))
        self.tasks.add(back)
        try:
            while True:
                try:
                    head = await client.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                body = await client.readexactly(length)
                await write_apart(to_sidecar, head, body) if body else to_sidecar.write(head)
        finally:
            to_sidecar.close()

    @staticmethod
    async def _answers(sidecar: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        try:
            while data := await sidecar.read(65536):
                to_client.write(data)
                await to_client.drain()
        finally:
            to_client.close()


async def test_httpx_whose_body_comes_in_the_read_after_its_head_is_sent_from_that_read(reads):
    import httpx

    async def run(side: Side) -> list[bytes]:
        async with (
            SplitHop(side.port) as hop,
            httpx.AsyncClient(headers={"Host": "sidecar.test"}) as client,
        ):
            answers = []
            for _ in range(2):  # a new connection, then the same one kept alive
                response = await client.post(
                    hop.url + "/v1/chat/completions",
                    content=BODY,
                    headers={"Content-Type": "application/json"},
                )
                answers.append(await response.aread())
            return answers

    async with Side() as on:
        answers = await run(on)
        await wait_for(lambda: len(on.relayed) == 2, timeout=5.0)
    assert len(reads[on.port]) == 4  # heads and bodies apart
    assert all(a.endswith(b"data: [DONE]\n\n") for a in answers)
    assert all(r.endswith(BODY) and r.startswith(b"POST /v1/chat/completions ") for r in on.relayed)
    assert len(on.records) == 2 and all(on_its_way(r) for r in on.records) and on.handled == 0


async def test_the_openai_sdk_through_a_network_that_parts_head_and_body_is_carried(
    reads,
):
    import openai

    async def run(side: Side) -> list[str]:
        async with SplitHop(side.port) as hop:
            client = openai.AsyncOpenAI(
                base_url=hop.url + "/v1",
                api_key="sk-test",
                max_retries=0,
                default_headers={"Host": "sidecar.test"},
            )
            texts = []
            for _ in range(2):
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                texts.append("".join([c.choices[0].delta.content or "" async for c in stream]))
            await client.close()
            return texts

    async with Side() as on:
        texts = await run(on)
        await wait_for(lambda: len(on.relayed) == 2, timeout=5.0)
    assert texts == ["hi", "hi"]
    assert len(reads[on.port]) == 4
    assert len(on.records) == 2 and all(on_its_way(r) for r in on.records) and on.handled == 0


async def test_a_body_that_comes_well_after_its_head_is_carried_and_sent_once(reads):
    """The head, then 20 ms later the body: the head was taken off aiohttp's queue at once,
    so no handler ever starts for it; the body's read sends it, once."""

    async def wait(reader) -> None:
        await asyncio.sleep(0.02)

    relayed, answers = recorded("chat-twice")
    async with Side() as on:
        answer = await head_then_body(on, post(), wait)
        await wait_for(lambda: len(on.relayed) == 1, timeout=5.0)
        await asyncio.sleep(0.05)  # nothing more arrives upstream
        assert len(on.relayed) == 1
    assert len(reads[on.port]) == 2
    assert on.relayed == relayed[:1] and answer == answers[0]
    assert len(on.records) == 1 and on_its_way(on.records[0]) and on.handled == 0
    assert on.counted("ok") == 1


async def test_a_body_in_two_reads_after_its_head_is_carried_and_sent_once(reads):
    relayed, answers = recorded("chat-twice")
    request = apart(post(), 10)
    on, got = await through(request)

    assert reads[on.port] == [len(p) for p in request]
    assert on.relayed == relayed[:1] and got == answers[:1]
    assert len(on.records) == 1 and on_its_way(on.records[0]) and on.handled == 0


STREAMED_OR_OTHERWISE_APART = [
    pytest.param("not-an-api-route", id="not-an-api-route"),
    pytest.param("http-1.0", id="http-1.0"),
    pytest.param("past-inspect-limit", id="past-the-inspect-limit"),
]


@pytest.mark.parametrize("case", STREAMED_OR_OTHERWISE_APART)
async def test_a_body_read_apart_goes_upstream_with_the_bytes_aiohttps_handler_sent(case, reads):
    door = DOOR["cases"][case]
    relayed, answers = recorded(case)
    request_parts = apart(_bytes(door["requests"])[0])
    on, got = await through(request_parts, **door["settings"])

    assert reads[on.port] == [len(p) for p in request_parts]
    assert on.relayed == relayed and got == answers
    assert len(on.records) == 1 and on.handled == 0


async def test_a_head_past_the_head_budget_is_answered_431_and_its_body_never_offered(reads):
    big = post(b"/v1/chat/completions", BODY, b"X-Pad: " + b"p" * 3000)
    on, answers = await through(apart(big), max_request_head_bytes=2048)

    assert answers[0].startswith(b"HTTP/1.1 431")
    assert on.relayed == [] and on.records == []


async def test_expect_100_continue_invites_the_body_that_then_goes_upstream():
    async def continued(reader) -> None:
        interim = await reader.readuntil(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100")

    async def expect_then_body(side: Side) -> bytes:
        return await head_then_body(
            side, post(b"/v1/chat/completions", BODY, b"Expect: 100-continue"), continued
        )

    relayed, answers = recorded("expect")
    async with Side() as on:
        answer = await expect_then_body(on)
        await wait_for(lambda: len(on.relayed) == 1, timeout=5.0)
    assert on.relayed == relayed and answer == answers[0].partition(b"\r\n\r\n")[2]
    assert len(on.records) == 1 and on.handled == 0


@pytest.mark.parametrize("sent", [0, 10], ids=["head-only", "part-of-the-body"])
async def test_a_client_gone_between_head_and_body_is_never_sent_nor_counted(sent):
    async def leave(side: Side) -> None:
        await side.exchange(post())  # a pooled upstream connection the next could take
        reader, writer = await asyncio.open_connection("127.0.0.1", side.port)
        head, body = apart(post())
        writer.write(head + body[:sent])
        await asyncio.sleep(0.02)
        writer.close()

    async with Side() as on:
        await leave(on)
        await asyncio.sleep(0.1)
        counts = (on.counted("ok"), on.counted("cancelled"), on.counted("error"), len(on.relayed))
    assert counts == (1, 0, 0, 1)  # only the first went upstream, and only it is counted
    # The first went upstream; the one that left was carried, and never sent.
    assert len(on.records) == 2 and on_its_way(on.records[0]) and not on_its_way(on.records[1])


async def test_a_client_gone_just_after_a_body_read_apart_stops_the_upstream_request_and_counts_once(
    reads,
):
    async with Side() as on:
        await on.exchange(post())  # a pooled upstream connection for the next one to take
        reader, writer = await asyncio.open_connection("127.0.0.1", on.port)
        head, body = apart(post())
        await write_apart(writer, head, body)
        writer.close()  # its FIN a read behind the body
        await sent_then_stopped_and_counted_once(on)
    assert reads[on.port][-2:] == [len(head), len(body)]
