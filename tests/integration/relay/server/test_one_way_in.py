"""The relay's one way in (sidecar/relay/data/exchange.py), over real sockets: a request it
carries is answered from the connection's own callbacks (aiohttp's handler never runs for
it) and the upstream gets exactly the bytes the door (aiohttp's handler) sends; what it
declines takes the door; a client that goes stops the upstream request and is counted once,
as cancelled.

The same holds for a head and its body that arrive in separate reads (httpx writes them
apart): the head is taken off aiohttp's queue at once and its body is awaited by the
exchange, whenever it comes.

Each case runs through two sidecars in front of the same kind of scripted upstream (which
records every request byte for byte): one as served, one with the relay's way in switched off
(the connection guard's ``carry`` hook removed: every request takes the door). A spy on the
hook records what it did, and one on the door counts its requests.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.app import RUNNER_KWARGS, SidecarRunner, build_sidecar
from sidecar.config import Settings
from sidecar.relay.control.self_loop import LOOP_HEADER, LOOP_TOKEN
from sidecar.relay.server.aiohttp_internals import GuardedRequestHandler
from tests.conftest import wait_for
from tests.support.scripted_server import Peer, ScriptedServer
from tests.support.sse import CHUNKED_HEAD, DONE, chunked

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
    one on the door."""

    def __init__(self, carried: bool, tracer_provider=None, **settings) -> None:
        self.carried = carried
        self.tracer_provider = tracer_provider
        self.settings = settings
        self.records: list[object] = []  # what the hook returned, per call
        self.door = 0  # requests aiohttp's handler answered

    async def __aenter__(self) -> Side:
        self.upstream = await ScriptedServer(answer_all).start()
        self.sc = build_sidecar(
            Settings(upstream=self.upstream.url, **self.settings), CollectorRegistry(), access_log=False,
            tracer_provider=self.tracer_provider,
        )  # fmt: skip
        self.runner = SidecarRunner(self.sc.proxy_app, shutdown_timeout=1.0, **RUNNER_KWARGS)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        guard = self.runner.server.guard  # type: ignore[union-attr]
        hook = guard.carry
        assert hook is not None  # the proxy port carries requests unless switched off

        def spy(connection, message, payload):
            record = hook(connection, message, payload)
            self.records.append(record)
            return record

        guard.carry = spy if self.carried else None
        app = self.sc.proxy_app
        entry = app._entry  # the door: every request aiohttp's handler answers

        async def door(request):
            self.door += 1
            return await entry(request)

        app._entry = door
        return self

    async def __aexit__(self, *exc) -> None:
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


async def both(
    *requests: bytes | tuple[bytes, ...], together: bool = False, **settings
) -> tuple[Side, Side, list[bytes], list[bytes]]:
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
    pytest.param(
        [post(b"/v1/completions", b'{"model":"m","prompt":"hi","stream":true}')], id="completions"
    ),
]


@pytest.mark.parametrize("requests", FORWARDED)
async def test_the_upstream_gets_the_same_bytes_either_way(requests):
    # Twice on one connection: the first finds no idle upstream connection (a task connects
    # and sends it), the second takes the pooled one and is written from the read itself.
    on, off, answers_on, answers_off = await both(*requests, *requests)

    assert on.relayed == off.relayed and len(on.relayed) == 2
    assert answers_on == answers_off and all(
        a.endswith(b"0\r\n\r\n") and b"[DONE]" in a for a in answers_on
    )
    assert all(r is not None for r in on.records) and len(on.records) == 2
    assert on.records[0].pending is not None  # type: ignore[attr-defined]
    assert on.records[1].sent is not None  # type: ignore[attr-defined]
    assert on.counted("ok") == off.counted("ok") == 2
    assert on.door == 0 and off.door == 2  # one way in: the handler never ran for them


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
    pytest.param(
        [post(b"/v1/chat/completions", BODY, b"Expect: 100-continue")], False, id="expect"
    ),
]


@pytest.mark.parametrize("requests,together", LEFT_TO_THE_HANDLER)
async def test_requests_the_relay_declines_take_the_door(requests, together):
    on, off, answers_on, answers_off = await both(*requests, together=together)

    assert on.relayed == off.relayed and on.relayed
    assert [a.split(b"\r\n")[0] for a in answers_on] == [a.split(b"\r\n")[0] for a in answers_off]
    assert all(r is None for r in on.records)  # offered and declined
    assert on.door == off.door == len(requests)


async def test_pipelined_requests_are_each_carried_and_answered_in_order():
    """Three requests in one write: each is carried once the one before it is answered and
    taken, never two at once, and the answers come in the order asked."""
    bodies = [b'{"model":"m","prompt":"%d","stream":true}' % i for i in range(3)]
    requests = [post(b"/v1/completions", body) for body in bodies]
    on, off, answers_on, answers_off = await both(*requests, together=True)

    assert on.relayed == off.relayed and len(on.relayed) == 3
    assert [r.endswith(b) for r, b in zip(on.relayed, bodies, strict=True)] == [True] * 3
    assert answers_on == answers_off and len(answers_on) == 3
    assert len(on.records) == 3 and all(r is not None for r in on.records)
    assert on.door == 0 and off.door == 3


GET_MODELS = b"GET /v1/models HTTP/1.1\r\nHost: sidecar.test\r\n\r\n"


async def test_more_pipelined_requests_than_aiohttps_queue_holds_are_each_answered_in_order():
    """aiohttp stops reading a connection whose queue of parsed requests is full (32): the
    relay takes them off that queue, so it must resume reading as aiohttp's own task would,
    or the 33rd request would never be read."""
    bodies = [b'{"model":"m","prompt":"%d","stream":true}' % i for i in range(45)]
    requests = [post(b"/v1/completions", body) for body in bodies]
    async with Side(True) as on:
        answers = await asyncio.wait_for(on.exchange(*requests, together=True), 20.0)
        posts = lambda: [r for r in on.relayed if r.startswith(b"POST ")]  # noqa: E731
        await wait_for(lambda: len(posts()) == 45, timeout=5.0)
        await asyncio.sleep(0.1)  # and no more
        assert [r.endswith(b) for r, b in zip(posts(), bodies, strict=True)] == [True] * 45
    assert len(answers) == 45 and all(a.endswith(b"0\r\n\r\n") for a in answers)
    assert on.door == 0 and len(on.records) == 45


async def test_a_declined_request_behind_a_carried_one_waits_its_turn_at_the_door():
    """A carried request, then one the relay declines (a GET), then one it would carry, in
    one write: the door takes the second only once the first is answered, and with it the
    third, queued behind it (aiohttp's task answers what is queued, in order)."""
    on, off, answers_on, answers_off = await both(post(), GET_MODELS, post(), together=True)

    assert on.relayed == off.relayed and len(on.relayed) == 3
    assert on.relayed[1].startswith(b"GET /v1/models ")
    assert [a.split(b"\r\n")[0] for a in answers_on] == [b"HTTP/1.1 200 OK"] * 3
    assert answers_on == answers_off
    assert [r is not None for r in on.records] == [True, False]
    assert on.door == 2 and off.door == 3


async def test_the_relay_carries_again_once_the_door_is_idle():
    """A GET through the door, then, once it is answered, a request the relay carries on the
    same connection: aiohttp's task waits for a request again, and the relay takes it."""
    on, off, answers_on, answers_off = await both(GET_MODELS, post(), post())

    assert on.relayed == off.relayed and len(on.relayed) == 3 and answers_on == answers_off
    assert [r is not None for r in on.records] == [False, True, True]
    assert on.door == 1 and off.door == 3


async def test_a_body_past_the_inspect_limit_takes_the_door():
    big = b'{"model":"m","prompt":"' + b"x" * 2048 + b'"}'
    on, off, _, _ = await both(post(b"/v1/completions", big), max_request_inspect_bytes=1024)
    assert on.relayed == off.relayed and on.records == [None] and on.door == 1


@pytest.mark.parametrize("apart", [False, True], ids=["body-with-head", "body-read-apart"])
async def test_the_sidecars_own_request_come_back_is_508_and_never_sent_upstream(apart):
    """One loop check for both ways in: a POST to an API route carrying this process's loop
    token (its own probe, come back through a forwarder) is refused before anything goes
    upstream, whichever read completed it; the door answers it 508."""
    looped = post(b"/v1/chat/completions", BODY, f"{LOOP_HEADER}: {LOOP_TOKEN}".encode())
    head, body = looped.split(b"\r\n\r\n", 1)
    request = (head + b"\r\n\r\n", body) if apart else looped
    for carried in (True, False):
        async with Side(carried) as side:
            await side.exchange(post())  # leaves an idle pooled upstream connection
            answers = await side.exchange(request)
            await asyncio.sleep(0.3)  # a request sent would have arrived by now
            assert answers[0].startswith(b"HTTP/1.1 508 ")
            assert b'"type":"upstream_loop"' in answers[0].replace(b" ", b"")
            assert len(side.relayed) == 1 and LOOP_TOKEN.encode() not in side.relayed[0]
            assert all(r is None for r in side.records[1:])  # offered, declined


async def test_no_carried_path_while_draining():
    async with Side(True) as on:
        on.sc.drain.draining = True
        await on.exchange(post())
    assert on.records == [None]


async def test_a_client_gone_with_its_request_sent_stops_the_upstream_request_and_counts_once():
    async with Side(True) as on:
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
    assert on.records[1] is not None and on.records[1].sent is not None  # type: ignore[attr-defined]


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]"], ids=["not-json", "not-an-object"])
@pytest.mark.parametrize("tracing", [False, True], ids=["untraced", "traced"])
async def test_a_gone_clients_request_whose_body_has_no_fields_is_recorded(body, tracing, spans):
    """A body that is not a JSON object has no fields to label with: a carried request whose
    client left once it was sent is recorded all the same, and with tracing on its span ends."""
    provider, exporter = spans
    async with Side(True, tracer_provider=provider if tracing else None) as on:
        await on.exchange(post())  # a pooled upstream connection for the next one to take
        sock = socket.create_connection(("127.0.0.1", on.port))
        sock.sendall(post(body=body))
        sock.close()
        await wait_for(lambda: on.counted("cancelled") == 1, timeout=5.0)
        assert on.records[1] is not None and on.records[1].sent is not None  # type: ignore[attr-defined]
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
    async with Side(True, tracer_provider=provider) as on:
        await on.exchange(traced)  # (and a pooled upstream connection for the next one to take)
        assert on_its_way(on.records[0])
        await wait_for(lambda: len(exporter.get_finished_spans()) == 1, timeout=5.0)
        sock = socket.create_connection(("127.0.0.1", on.port))
        sock.sendall(traced)
        sock.close()  # request and FIN together
        await wait_for(lambda: len(exporter.get_finished_spans()) == 2, timeout=5.0)
        assert on.records[1] is not None and on.records[1].sent is not None  # type: ignore[attr-defined]
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
    received = GuardedRequestHandler.data_received

    def watched(self, data: bytes) -> None:
        if data and self.transport is not None:
            seen.setdefault(self.transport.get_extra_info("sockname")[1], []).append(len(data))
        received(self, data)

    monkeypatch.setattr(GuardedRequestHandler, "data_received", watched)
    return seen


def on_its_way(record) -> bool:
    """The hook carried it, and it went upstream (on a pooled connection, or a task connecting)."""
    return record is not None and (record.sent is not None or record.pending is not None)


@pytest.mark.parametrize("requests", FORWARDED)
async def test_a_body_read_after_its_head_goes_upstream_from_that_read_with_the_same_bytes(
    requests, reads
):
    # Twice on one connection: a task connects for the first, the second is written at once.
    request = apart(requests[0])
    on, off, answers_on, answers_off = await both(request, request)

    assert reads[on.port] == reads[off.port] == [len(request[0]), len(request[1])] * 2  # apart
    assert on.relayed == off.relayed and len(on.relayed) == 2
    assert answers_on == answers_off and all(
        a.endswith(b"0\r\n\r\n") and b"[DONE]" in a for a in answers_on
    )
    assert len(on.records) == 2 and all(
        on_its_way(r) for r in on.records
    )  # offered once each, sent
    assert on.records[0].pending is not None and on.records[1].sent is not None  # type: ignore[attr-defined]
    assert on.counted("ok") == off.counted("ok") == 2


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

    async with Side(True) as on, Side(False) as off:
        answers_on, answers_off = await run(on), await run(off)
        await wait_for(lambda: len(on.relayed) == len(off.relayed) == 2, timeout=5.0)
    assert reads[on.port] == reads[off.port] and len(reads[on.port]) == 4  # heads and bodies apart
    assert on.relayed == off.relayed and answers_on == answers_off and b"[DONE]" in answers_on[0]
    assert len(on.records) == 2 and all(on_its_way(r) for r in on.records)


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

    async with Side(True) as on, Side(False) as off:
        texts_on, texts_off = await run(on), await run(off)
        await wait_for(lambda: len(on.relayed) == len(off.relayed) == 2, timeout=5.0)
    assert texts_on == texts_off == ["hi", "hi"]
    assert len(reads[on.port]) == 4 and on.relayed == off.relayed
    assert len(on.records) == 2 and all(on_its_way(r) for r in on.records)


async def test_a_body_that_comes_well_after_its_head_is_carried_and_sent_once(reads):
    """The head, then 20 ms later the body: the head was taken off aiohttp's queue at once,
    so no handler ever starts for it; the body's read sends it, once."""

    async def wait(reader) -> None:
        await asyncio.sleep(0.02)

    async with Side(True) as on, Side(False) as off:
        answer_on = await head_then_body(on, post(), wait)
        answer_off = await head_then_body(off, post(), wait)
        await wait_for(lambda: len(on.relayed) == len(off.relayed) == 1, timeout=5.0)
        await asyncio.sleep(0.05)  # nothing more arrives upstream
        assert len(on.relayed) == 1 and len(on.upstream.requests) == len(off.upstream.requests)
    assert reads[on.port] == reads[off.port] and len(reads[on.port]) == 2
    assert on.relayed == off.relayed and answer_on == answer_off
    assert len(on.records) == 1 and on_its_way(on.records[0]) and on.door == 0
    assert on.counted("ok") == off.counted("ok") == 1


async def test_a_body_in_two_reads_after_its_head_is_carried_and_sent_once(reads):
    request = apart(post(), 10)
    on, off, answers_on, answers_off = await both(request)

    assert reads[on.port] == reads[off.port] == [len(p) for p in request]
    assert on.relayed == off.relayed and len(on.relayed) == 1 and answers_on == answers_off
    assert len(on.records) == 1 and on_its_way(on.records[0]) and on.door == 0


LEFT_TO_THE_HANDLER_APART = [
    pytest.param(apart(post(b"/not/an/api", b"{}")), id="not-an-api-route"),
    pytest.param(apart(post(version=b"1.0")), id="http-1.0"),
    pytest.param(
        apart(post(b"/v1/completions", b'{"model":"m","prompt":"' + b"x" * 2048 + b'"}')),
        id="past-the-inspect-limit",
    ),
]


@pytest.mark.parametrize("request_parts", LEFT_TO_THE_HANDLER_APART)
async def test_a_body_read_apart_that_the_relay_declines_takes_the_door(request_parts, reads):
    on, off, answers_on, answers_off = await both(request_parts, max_request_inspect_bytes=1024)

    assert reads[on.port] == reads[off.port] == [len(p) for p in request_parts]
    assert on.relayed == off.relayed and on.relayed
    assert [a.split(b"\r\n")[0] for a in answers_on] == [a.split(b"\r\n")[0] for a in answers_off]
    assert on.records == [None] and on.door == 1  # offered from the head's read, declined


async def test_a_head_past_the_head_budget_is_answered_431_and_its_body_never_offered(reads):
    big = post(b"/v1/chat/completions", BODY, b"X-Pad: " + b"p" * 3000)
    on, off, answers_on, answers_off = await both(apart(big), max_request_head_bytes=2048)

    assert answers_on[0].startswith(b"HTTP/1.1 431") and answers_off[0].startswith(b"HTTP/1.1 431")
    assert on.relayed == off.relayed == [] and on.records == []


async def test_expect_100_continue_then_the_body_takes_the_door():
    async def continued(reader) -> None:
        interim = await reader.readuntil(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100")

    async def expect_then_body(side: Side) -> bytes:
        return await head_then_body(
            side, post(b"/v1/chat/completions", BODY, b"Expect: 100-continue"), continued
        )

    async with Side(True) as on, Side(False) as off:
        answer_on, answer_off = await expect_then_body(on), await expect_then_body(off)
        await wait_for(lambda: len(on.relayed) == len(off.relayed) == 1, timeout=5.0)
    assert on.relayed == off.relayed and answer_on == answer_off
    assert all(r is None for r in on.records)


async def test_no_body_read_apart_is_carried_while_draining():
    async with Side(True) as on:
        on.sc.drain.draining = True
        await on.exchange(apart(post()))
    assert on.records == [None]


@pytest.mark.parametrize("sent", [0, 10], ids=["head-only", "part-of-the-body"])
async def test_a_client_gone_between_head_and_body_is_counted_as_through_the_door(sent):
    async def leave(side: Side) -> None:
        await side.exchange(post())  # a pooled upstream connection the next could take
        reader, writer = await asyncio.open_connection("127.0.0.1", side.port)
        head, body = apart(post())
        writer.write(head + body[:sent])
        await asyncio.sleep(0.02)
        writer.close()

    async with Side(True) as on, Side(False) as off:
        await leave(on)
        await leave(off)
        await asyncio.sleep(0.1)
        counts = [
            (
                side.counted("ok"),
                side.counted("cancelled"),
                side.counted("error"),
                len(side.relayed),
            )
            for side in (on, off)
        ]
    assert (
        counts[0] == counts[1] and counts[0][0] == 1 and counts[0][3] == 1
    )  # only the first went upstream
    # The first went upstream; the one that left was carried, and never sent.
    assert len(on.records) == 2 and on_its_way(on.records[0]) and not on_its_way(on.records[1])


async def test_a_client_gone_just_after_a_body_read_apart_stops_the_upstream_request_and_counts_once(
    reads,
):
    async with Side(True) as on:
        await on.exchange(post())  # a pooled upstream connection for the next one to take
        reader, writer = await asyncio.open_connection("127.0.0.1", on.port)
        head, body = apart(post())
        await write_apart(writer, head, body)
        writer.close()  # its FIN a read behind the body
        await sent_then_stopped_and_counted_once(on)
    assert reads[on.port][-2:] == [len(head), len(body)]
