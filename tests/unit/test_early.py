"""Early.abandon (sidecar/relay/data/early.py) for each way a request can be on its way: written
on a pooled connection, a task still connecting, a task that already has its answer, or a
task that failed; the request is recorded only if it was written. Then which read offers a
request to the early path: the one with its head and whole body, or a later one that
completes the body before the handler claimed the request (never both ways)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from sidecar.relay.data.early import Early, EarlyForwarder
from sidecar.relay.server import aiohttp_internals as ai
from sidecar.relay.server.aiohttp_internals import GuardedServer
from sidecar.relay.server.client_guard import ConnectionGuard


class Conn:
    closed = False

    def close(self) -> None:
        self.closed = True


class SentStub:
    def __init__(self) -> None:
        self.conn = Conn()


def early(recorded: list) -> Early:
    e = Early(headers=None, path="/v1/chat/completions", start=1.0, body=b"{}")
    e._abandoned = recorded.append
    return e


def test_a_written_request_is_stopped_and_recorded():
    recorded: list = []
    e = early(recorded)
    e.sent, e.sent_at = SentStub(), 1.5  # type: ignore[assignment]
    e.abandon()
    assert e.sent.conn.closed and recorded == [e]  # type: ignore[union-attr]


async def test_a_task_still_connecting_is_cancelled_and_not_recorded():
    recorded: list = []
    e = early(recorded)
    e.pending = asyncio.ensure_future(asyncio.sleep(10))  # type: ignore[assignment]
    e.abandon()
    await asyncio.sleep(0)
    assert e.pending.cancelled() and recorded == []


async def test_a_task_with_its_answer_has_its_connection_closed_and_is_recorded():
    recorded: list = []
    e = early(recorded)
    conn = Conn()

    async def answered() -> Conn:
        e.mark_sent(2.0)
        return conn

    e.pending = asyncio.ensure_future(answered())  # type: ignore[assignment]
    await asyncio.sleep(0)
    e.abandon()
    assert conn.closed and recorded == [e] and e.sent_at == 2.0


async def test_a_failed_task_is_left_as_it_failed():
    recorded: list = []
    e = early(recorded)

    async def refused() -> Conn:
        raise ConnectionRefusedError

    e.pending = asyncio.ensure_future(refused())  # type: ignore[assignment]
    await asyncio.sleep(0)
    e.abandon()  # the exception is retrieved (no "never retrieved" warning), nothing recorded
    assert recorded == []


# The connection side (sidecar/relay/server/aiohttp_internals.py): which read offers a request
# to the early path. A real GuardedRequestHandler with aiohttp's real parser, fed reads by hand
# on a transport that only takes writes; its connection's task and handler run when the test
# yields to the loop, which is how each test orders the reads against the handler's start.


class Transport:
    """Just enough of a socket transport for aiohttp's connection handler."""

    def __init__(self) -> None:
        self.written, self.closing = b"", False

    def get_extra_info(self, name, default=None):
        return default

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar.test\r\nContent-Length: 24\r\n\r\n"
BODY = b'{"model":"m","prompt":1}'
assert len(BODY) == 24


class Connection:
    """One guarded client connection whose early hook records each offer and takes it (a
    record as the early path makes one, nothing sent), and whose handler claims the record as
    the proxy's does first thing, then reads the body when it did not get one."""

    def __init__(self, head_budget: int = 0) -> None:
        self.offers: list[tuple[bytes, bool]] = []  # (body, whole) per offer
        self.claimed: list[Early | None] = []
        self.bodies: list[bytes] = []
        self.guard = ConnectionGuard(head_budget=head_budget, early=self.offer)
        server = GuardedServer(self.handle, loop=asyncio.get_running_loop(), guard=self.guard)
        self.handler = server()
        self.transport = Transport()
        self.handler.connection_made(self.transport)

    def offer(self, message, payload, transport) -> Early | None:
        whole = payload.is_eof()
        body = payload.read_nowait() if whole else b""
        self.offers.append((body, whole))
        return (
            Early(message.headers, message.path, 0.0, body) if whole else None
        )  # as the forwarder

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        early_request = EarlyForwarder.claim(request)
        self.claimed.append(early_request)
        self.bodies.append(
            early_request.body if early_request is not None else await request.read()
        )
        return web.Response(text="ok")

    def read(self, *data: bytes) -> None:
        for chunk in data:  # each a read of its own, all in this loop turn
            self.handler.data_received(chunk)

    @property
    def slot(self):
        return self.handler.early_slot

    async def close(self) -> None:
        self.handler.connection_lost(None)
        await asyncio.sleep(0.01)


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_body_in_reads_after_its_heads_is_offered_once_from_the_read_that_completes_it():
    c = Connection()
    c.read(HEAD)
    assert c.offers == []  # the head alone: remembered, not offered
    c.read(BODY[:10], BODY[10:20])
    assert c.offers == []  # body not complete yet
    c.read(BODY[20:])
    assert c.offers == [(BODY, True)]
    await turns(5)  # the handler runs now and finds the record its connection made
    assert len(c.claimed) == 1 and c.claimed[0] is not None and c.claimed[0].body == BODY
    assert c.slot.record is None and c.bodies == [BODY]
    await c.close()


async def test_a_body_read_after_the_task_took_the_request_but_before_its_handler_ran_is_offered():
    # Python 3.11: the connection's task takes the request off the queue one turn after its
    # head's read and its handler starts one turn later; a body read in between is in time.
    c = Connection()
    c.read(HEAD)
    await turns(1)
    assert ai.last_message(c.handler) == (None, None) and c.claimed == []  # taken, not started
    c.read(BODY)
    assert c.offers == [(BODY, True)]
    await turns(5)
    assert len(c.claimed) == 1 and c.claimed[0] is not None and c.claimed[0].body == BODY
    assert c.bodies == [BODY]
    await c.close()


async def test_a_handler_that_claimed_first_reads_the_body_itself_and_nothing_is_offered():
    c = Connection()
    c.read(HEAD)
    await turns(3)
    assert c.claimed == [None]  # its handler claimed: nothing sent, it reads the body
    c.read(BODY[:5])
    c.read(BODY[5:])
    await turns(5)
    assert c.offers == [] and c.bodies == [BODY]  # one way only: the handler's
    await c.close()


async def test_a_head_with_its_whole_body_is_offered_from_that_read_as_before():
    c = Connection()
    c.read(HEAD + BODY)
    assert c.offers == [(BODY, True)]
    await c.close()


async def test_a_next_head_in_the_read_that_completes_a_body_leaves_both_to_their_handlers():
    c = Connection()
    c.read(HEAD)
    c.read(BODY + HEAD + BODY)  # pipelined: not the only request waiting
    assert c.offers == []
    await turns(10)
    assert c.claimed == [None, None] and c.bodies == [BODY, BODY]
    await c.close()


async def test_a_connection_closed_between_head_and_body_forgets_the_head():
    c = Connection()
    c.read(HEAD, BODY[:3])
    await c.close()
    assert c.offers == [] and c.slot.record is None


async def test_a_head_past_the_budget_is_refused_and_never_remembered():
    c = Connection(head_budget=64)  # HEAD is 80 bytes
    c.read(HEAD)
    assert c.transport.written.startswith(b"HTTP/1.1 431")
    c.read(BODY)
    assert c.offers == []
    await c.close()
