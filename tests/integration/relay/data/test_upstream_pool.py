"""UpstreamPool and UpstreamConnection over real sockets, against a scripted raw TCP server.

Each test starts a tiny ``asyncio.start_server`` whose script reads requests and answers
with exact bytes (``tests.support.scripted_server``). The server records every byte it read, every request (raw bytes, framing
included) and every connection it accepted, and notices when the client closes one. The
body sink is a list.

The ``rig`` fixture's teardown closes the pools, then checks that every connection they
opened was closed (the server saw EOF, or closed it itself) and that no asyncio task is
left behind.

Timing: nothing is asserted to happen *fast*. Timeouts are checked as "not before the
timeout" and "within several times the timeout", so a loaded machine does not flake them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sidecar.base.outcomes import Verdict
from sidecar.relay.data.http1 import ResponseParser
from sidecar.relay.data.upstream import UpstreamConnection, UpstreamError, UpstreamPool
from tests.support.scripted_server import Peer, Script, ScriptedServer, response, serve
from tests.support.sse import CHUNKED_HEAD, LAST_CHUNK, http_chunk
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

READ_TIMEOUT = 0.3
SLACK = 0.02  # clock reads around a deadline: "not before the timeout" up to this
# How late a timer may fire and still count as "the read timeout": a loaded machine delays
# callbacks, so this is generous; what it rules out is a timeout that never fires or only at
# another deadline (the test's own 5 s wait).
LATE = 3.0
OK = response()


# -- the client side -----------------------------------------------------------------------


class Sink:
    """A BodySink that keeps everything, with the loop time of each call."""

    def __init__(self, on_body: Callable[[bytes], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self.pieces: list[bytes] = []
        self.times: list[float] = []
        self.ends: list[str | None] = []
        self.frames: list[bytes] = []
        self.reads: list[int] = []  # pieces per several() call
        self.lasts: list[int] = []  # pieces per last() call (the read that ended the body)
        self.end_time: float | None = None
        self._done = asyncio.Event()
        self._on_body = on_body

    def body(self, piece: bytes) -> None:
        self.pieces.append(bytes(piece))
        self.times.append(self._loop.time())
        if self._on_body is not None:
            self._on_body(piece)

    def chunk(self, frame: bytes, piece: bytes) -> None:
        # The frame is the whole chunk as received, around exactly this piece.
        assert frame == b"%x\r\n%b\r\n" % (len(piece), piece) or frame.endswith(
            b"\r\n" + piece + b"\r\n"
        )
        self.frames.append(frame)
        self.body(piece)

    def chunks(self, frames: bytes, pieces: list[bytes]) -> None:
        # The read is these pieces' chunks back to back, exactly.
        assert frames == b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) or frames.endswith(
            b"\r\n" + pieces[-1] + b"\r\n"
        )
        self.frames.append(frames)
        for piece in pieces:
            self.body(piece)

    def several(self, pieces: list[bytes]) -> None:
        self.reads.append(len(pieces))
        for piece in pieces:
            self.body(piece)

    def end(self, error: str | None) -> None:
        self.ends.append(error)
        self.end_time = self._loop.time()
        self._done.set()

    def last(self, pieces: list[bytes], frames: bytes | None = None) -> None:
        if frames is not None:  # the read as received: these pieces' chunks, then the end
            assert frames.endswith(b"\r\n\r\n") and self._chunks_of(frames) == pieces
            self.frames.append(frames)
        self.lasts.append(len(pieces))
        for piece in pieces:
            self.body(piece)
        self.end(None)

    @staticmethod
    def _chunks_of(frames: bytes) -> list[bytes]:
        parser = ResponseParser()
        parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        pieces = parser.feed(frames)
        assert parser.done and not parser.trailing
        return pieces

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)

    async def wait(self, timeout: float = 5.0) -> str | None:
        await asyncio.wait_for(self._done.wait(), timeout)
        return self.ends[0]


class Chunks:
    """A streamed (not replayable) request body; a class, not an async generator, so that
    abandoning it leaves no finaliser task behind."""

    def __init__(self, pieces: list[bytes], delay: float = 0.0) -> None:
        self._pieces = list(pieces)
        self._delay = delay
        self.taken = 0

    def __aiter__(self) -> Chunks:
        return self

    async def __anext__(self) -> bytes:
        if self.taken >= len(self._pieces):
            raise StopAsyncIteration
        if self._delay:
            await asyncio.sleep(self._delay)
        self.taken += 1
        return self._pieces[self.taken - 1]


class Endless:
    """A large streamed body (64 KiB pieces, at most 1 GiB)."""

    def __init__(self) -> None:
        self.taken = 0

    def __aiter__(self) -> Endless:
        return self

    async def __anext__(self) -> bytes:
        if self.taken >= 1 << 14:
            raise StopAsyncIteration
        self.taken += 1
        return b"x" * (1 << 16)


async def fetch(
    pool: UpstreamPool, method: str = "GET", target: str = "/", headers=(), body=None
) -> tuple[UpstreamConnection, Sink]:
    conn = await pool.request(method, target, headers, body)
    sink = Sink()
    conn.push(sink)
    await sink.wait()
    return conn, sink


class Rig:
    def __init__(self) -> None:
        self.servers: list[ScriptedServer] = []
        self.pools: list[UpstreamPool] = []

    async def server(self, script: Script) -> ScriptedServer:
        server = await ScriptedServer(script).start()
        self.servers.append(server)
        return server

    def pool(self, url: str, *, read_timeout: float | None = 5.0, **kwargs) -> UpstreamPool:
        pool = UpstreamPool(url, connect_timeout=2.0, read_timeout=read_timeout, **kwargs)
        self.pools.append(pool)
        return pool

    async def teardown(self) -> None:
        for pool in self.pools:
            await pool.close()
            assert not pool._all and not pool._idle
        peers = [peer for server in self.servers for peer in server.peers]
        for peer in peers:
            peer.go.set()  # a script waiting on its cue goes on to read until EOF
        try:
            await wait_for(
                lambda: all(p.eof.is_set() or p.closed_by_server for p in peers), timeout=5.0
            )
        except AssertionError:
            open_ = [p.index for p in peers if not (p.eof.is_set() or p.closed_by_server)]
            raise AssertionError(f"connections left open after pool.close(): {open_}") from None
        for server in self.servers:
            await server.stop()
        current = asyncio.current_task()

        def others() -> list[asyncio.Task]:
            return [t for t in asyncio.all_tasks() if t is not current]

        try:
            await wait_for(lambda: not others(), timeout=2.0)
        except AssertionError:
            raise AssertionError(f"tasks left behind: {others()}") from None


@pytest.fixture
async def rig():
    r = Rig()
    yield r
    await r.teardown()


def now() -> float:
    return asyncio.get_running_loop().time()


# -- 1. connection reuse -------------------------------------------------------------------


async def test_keepalive_connection_is_reused(rig):
    server = await rig.server(serve(response(b"first"), response(b"second")))
    pool = rig.pool(server.url)

    conn1, sink1 = await fetch(pool, target="/a")
    assert not conn1.reused
    pool.release(conn1)
    conn2, sink2 = await fetch(pool, target="/b")
    assert conn2 is conn1 and conn2.reused
    pool.release(conn2)

    assert (sink1.data, sink1.ends) == (b"first", [None])
    assert (sink2.data, sink2.ends) == (b"second", [None])
    assert server.accepted == 1
    assert [r.split(b" ")[1] for r in server.peers[0].requests] == [b"/a", b"/b"]
    assert not server.peers[0].eof.is_set()  # still open, pooled


@pytest.mark.parametrize(
    "answer",
    [
        response(b"ok", b"200 OK", b"Connection: close"),
        response(b"ok", b"200 OK", b"Connection: keep-alive, Close"),
        response(b"ok", version=b"1.0"),
    ],
    ids=["connection-close", "connection-close-list", "http-1.0"],
)
async def test_response_that_forbids_keepalive_is_not_reused(rig, answer):
    # The server leaves the connection open: it is our side that must not reuse it.
    server = await rig.server(serve(answer))
    pool = rig.pool(server.url)

    conn1, sink1 = await fetch(pool)
    pool.release(conn1)
    conn2, sink2 = await fetch(pool)
    pool.release(conn2)

    assert sink1.ends == sink2.ends == [None]
    assert sink1.data == sink2.data == b"ok"
    assert server.accepted == 2
    assert conn2 is not conn1 and not conn2.reused
    assert [len(p.requests) for p in server.peers] == [1, 1]
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)  # we closed the first one


async def test_close_delimited_body_is_whole_at_eof_and_not_reused(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        if peer.index == 0:
            peer.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
            await asyncio.sleep(0.05)
            peer.send(b"part two")
            await asyncio.sleep(0.05)
            peer.close()
        else:
            peer.send(OK)

    server = await rig.server(script)
    pool = rig.pool(server.url)

    conn1 = await pool.request("GET", "/", [], None)
    assert conn1.head.status == 200 and conn1.head.length is None and not conn1.head.chunked
    sink1 = Sink()
    conn1.push(sink1)
    assert await sink1.wait() is None
    assert sink1.data == b"part one, part two"
    pool.release(conn1)
    assert not pool._idle

    conn2, sink2 = await fetch(pool)
    pool.release(conn2)
    assert sink2.data == b"ok"
    assert conn2 is not conn1 and server.accepted == 2
    assert sink1.ends == [None]


# -- 2. keep-alive expiry ------------------------------------------------------------------


async def test_idle_connection_expires_after_keepalive_seconds(rig):
    server = await rig.server(serve(OK))
    pool = rig.pool(server.url, keepalive_seconds=0.2)

    conn1, _ = await fetch(pool)
    pool.release(conn1)
    await asyncio.sleep(0.4)
    assert not server.peers[0].eof.is_set()  # expiry is noticed when the pool is next used
    conn2, sink2 = await fetch(pool)
    pool.release(conn2)

    assert sink2.ends == [None]
    assert server.accepted == 2 and conn2 is not conn1
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)  # closed by us
    assert not server.peers[0].closed_by_server
    assert [len(p.requests) for p in server.peers] == [1, 1]


async def test_connection_within_keepalive_seconds_is_reused(rig):
    server = await rig.server(serve(OK))
    pool = rig.pool(server.url, keepalive_seconds=5.0)

    conn1, _ = await fetch(pool)
    pool.release(conn1)
    await asyncio.sleep(0.2)
    conn2, _ = await fetch(pool)
    pool.release(conn2)
    assert server.accepted == 1 and conn2 is conn1


# -- 3. stale connections and the retry ----------------------------------------------------


@pytest.mark.parametrize("pause", [0.0, 0.2], ids=["at-once", "after-a-while"])
async def test_server_closing_idle_connection_is_survived(rig, pause):
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_request()
            peer.send(response(b"one"))
            peer.close()  # e.g. a server whose keep-alive is shorter than ours
        else:
            await serve(response(b"two"))(peer)

    server = await rig.server(script)
    pool = rig.pool(server.url)

    conn1, _ = await fetch(pool, "POST", "/first", [], b"1")
    pool.release(conn1)
    await asyncio.sleep(pause)
    conn2, sink2 = await fetch(pool, "POST", "/second", [], b"2")
    pool.release(conn2)

    assert (sink2.data, sink2.ends) == (b"two", [None])
    assert server.accepted == 2
    second = [r for r in server.requests if r.startswith(b"POST /second ")]
    assert len(second) == 1 and second == server.peers[1].requests


@pytest.mark.parametrize(
    "method, headers, body, retried",
    [
        ("GET", [], None, True),
        ("PUT", [("Content-Type", "application/json")], b'{"n":2}', True),
        (
            "POST",
            [("Content-Type", "application/json"), ("Idempotency-Key", "k1")],
            b'{"n":2}',
            True,
        ),
        # A POST may have been read by a server that then died: never sent twice.
        ("POST", [("Content-Type", "application/json")], b'{"n":2}', False),
    ],
)
async def test_stale_reused_connection_retries_only_idempotent_requests(
    rig, method, headers, body, retried
):
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_request()
            peer.send(OK)
            await peer.go.wait()  # the test shuts this side down; nothing more is read
        else:
            await serve(response(b"fresh"))(peer)

    server = await rig.server(script)
    pool = rig.pool(server.url)
    exchanges = 0
    real_exchange = pool._exchange

    async def counting_exchange(*args, **kwargs):
        nonlocal exchanges
        exchanges += 1
        return await real_exchange(*args, **kwargs)

    pool._exchange = counting_exchange  # type: ignore[method-assign]

    conn1, _ = await fetch(pool)
    pool.release(conn1)
    exchanges = 0
    # The server closes, and the request goes out before our loop has read the FIN: the
    # race a keep-alive client always has. Deterministic: no await in between.
    server.peers[0].hard_close()
    pending = pool.request(method, "/again", headers, body)
    if not retried:
        with pytest.raises(UpstreamError) as info:
            await pending
        assert (
            info.value.verdict is Verdict.UPSTREAM_DISCONNECTED
            and info.value.verdict.answer_status == 502
        )
        assert exchanges == 1 and server.accepted == 1
        return
    conn2 = await pending
    assert conn2 is not conn1 and not conn2.reused and conn1.closed
    sink = Sink()
    conn2.push(sink)
    assert await sink.wait() is None
    pool.release(conn2)

    assert sink.data == b"fresh"
    assert exchanges == 2  # the stale connection, then one retry
    assert server.accepted == 2
    assert len(server.peers[1].requests) == 1
    assert server.peers[1].requests[0].startswith(b"%s /again HTTP/1.1\r\n" % method.encode())
    assert len([r for r in server.requests if r.startswith(b"%s /again " % method.encode())]) == 1


async def test_streamed_body_on_a_stale_reused_connection_is_not_retried(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(OK)
        await peer.go.wait()

    server = await rig.server(script)
    pool = rig.pool(server.url)

    conn1, _ = await fetch(pool)
    pool.release(conn1)
    server.peers[0].hard_close()
    body = Chunks([b"not ", b"replayable"])
    with pytest.raises(UpstreamError) as caught:
        await pool.request("POST", "/stream", [], body)

    assert (
        caught.value.verdict is Verdict.UPSTREAM_DISCONNECTED
        and caught.value.verdict.answer_status == 502
    )
    assert server.accepted == 1  # no second attempt
    assert conn1.closed and not pool._all


async def test_pool_close_while_waiting_for_head_does_not_resend_elsewhere(rig):
    """pool.close() closes a reused connection whose request the server already read: the
    request fails; the pool must not reopen a connection after close() and send it again."""

    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_request()
            peer.send(OK)
            await peer.read_request()  # read, never answered; then we close
        else:
            await serve(OK)(peer)

    server = await rig.server(script)
    pool = rig.pool(server.url)

    conn1, _ = await fetch(pool)
    pool.release(conn1)
    pending = asyncio.create_task(pool.request("POST", "/slow", [], b"{}"))
    await wait_for(lambda: len(server.requests) == 2)
    await pool.close()
    (outcome,) = await asyncio.wait_for(asyncio.gather(pending, return_exceptions=True), 5)
    if isinstance(outcome, UpstreamConnection):
        pool.release(outcome)

    assert server.accepted == 1, "a connection was opened after pool.close()"
    assert len(server.requests) == 2, "the request the server already had was sent again"
    assert isinstance(outcome, UpstreamError)


# -- 4. the request bytes ------------------------------------------------------------------


async def _one_request(rig, method, target, headers, body, base=""):
    server = await rig.server(serve(OK if method != "HEAD" else b"HTTP/1.1 200 OK\r\n\r\n"))
    pool = rig.pool(server.url + base)
    conn, sink = await fetch(pool, method, target, headers, body)
    pool.release(conn)
    assert sink.ends == [None]
    assert server.accepted == 1 and len(server.requests) == 1
    return server, server.requests[0]


async def test_get_request_bytes(rig):
    headers = [("Accept", "text/event-stream"), ("X-B", "2"), ("x-a", "1"), ("X-B", "3")]
    server, raw = await _one_request(
        rig, "GET", "/v1/models?x=1&y=%20", headers, None, base="/base/"
    )
    assert raw == (
        b"GET /base/v1/models?x=1&y=%%20 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Accept: text/event-stream\r\nX-B: 2\r\nx-a: 1\r\nX-B: 3\r\n\r\n" % server.port
    )
    assert bytes(server.peers[0].received) == raw  # nothing else was sent


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
async def test_bodyless_methods_send_no_content_length(rig, method):
    server, raw = await _one_request(rig, method, "/x", [], None)
    assert raw == b"%b /x HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (method.encode(), server.port)


async def test_post_bytes_body_gets_content_length(rig):
    body = b'{"model":"m","stream":true}'
    server, raw = await _one_request(
        rig, "POST", "/v1/chat/completions", [("Content-Type", "application/json")], body
    )
    assert raw == (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (server.port, len(body), body)
    )


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_bodyless_post_gets_content_length_zero(rig, method):
    server, raw = await _one_request(rig, method, "/x", [("X-A", "1")], None)
    assert raw == b"%b /x HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n" % (
        method.encode(),
        server.port,
    )


async def test_bodyless_post_with_given_content_length_is_not_duplicated(rig):
    server, raw = await _one_request(
        rig, "POST", "/x", [("content-length", "0"), ("X-A", "1")], None
    )
    assert (
        raw
        == b"POST /x HTTP/1.1\r\nHost: 127.0.0.1:%d\r\ncontent-length: 0\r\nX-A: 1\r\n\r\n"
        % server.port
    )
    assert raw.lower().count(b"content-length") == 1


async def test_empty_bytes_body_gets_content_length_zero(rig):
    server, raw = await _one_request(rig, "POST", "/x", [], b"")
    assert (
        raw == b"POST /x HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 0\r\n\r\n" % server.port
    )


async def test_bytes_body_with_a_content_length_header_is_refused(rig):
    server = await rig.server(serve(OK))
    pool = rig.pool(server.url)
    with pytest.raises(ValueError):
        await pool.request("POST", "/x", [("Content-Length", "3")], b"abc")
    assert server.accepted == 0


async def test_streamed_body_is_sent_chunked(rig):
    body = Chunks([b"hello", b"", b" world", b"x" * 300], delay=0.01)
    server, raw = await _one_request(rig, "POST", "/up", [("Content-Type", "text/plain")], body)
    assert raw == (
        b"POST /up HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n12c\r\n%b\r\n0\r\n\r\n" % (server.port, b"x" * 300)
    )
    assert body.taken == 4


async def test_empty_streamed_body_is_one_last_chunk(rig):
    server, raw = await _one_request(rig, "POST", "/up", [], Chunks([]))
    assert (
        raw
        == b"POST /up HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        % server.port
    )


async def test_streamed_body_with_content_length_is_sent_raw(rig):
    body = Chunks([b"hello", b" ", b"world"], delay=0.01)
    server, raw = await _one_request(rig, "PUT", "/up", [("Content-Length", "11")], body)
    assert (
        raw
        == b"PUT /up HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 11\r\n\r\nhello world"
        % server.port
    )
    assert b"transfer-encoding" not in raw.lower()


# -- 5. errors -----------------------------------------------------------------------------


async def test_connection_refused_is_unreachable(rig, refused_url):
    pool = rig.pool(refused_url)
    with pytest.raises(UpstreamError) as caught:
        await pool.request("GET", "/", [], None)
    assert (caught.value.verdict, caught.value.verdict.answer_status) == (
        Verdict.UPSTREAM_UNREACHABLE,
        502,
    )
    assert not pool._all


async def test_server_that_never_answers_is_a_timeout(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()  # then silence until we close

    server = await rig.server(script)
    pool = rig.pool(server.url, read_timeout=READ_TIMEOUT)
    start = now()
    with pytest.raises(UpstreamError) as caught:
        await pool.request("GET", "/", [], None)
    elapsed = now() - start
    assert (caught.value.verdict, caught.value.verdict.answer_status) == (
        Verdict.UPSTREAM_TIMEOUT,
        504,
    )
    assert READ_TIMEOUT - SLACK <= elapsed < READ_TIMEOUT + LATE
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)  # and we closed the connection
    assert server.accepted == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/9 nonsense\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    ],
    ids=["status-line", "conflicting-length", "transfer-coding", "bare-lf"],
)
async def test_garbage_response_is_invalid(rig, answer):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(answer)

    server = await rig.server(script)
    pool = rig.pool(server.url)
    with pytest.raises(UpstreamError) as caught:
        await pool.request("GET", "/", [], None)
    assert (caught.value.verdict, caught.value.verdict.answer_status) == (
        Verdict.UPSTREAM_INVALID_RESPONSE,
        502,
    )
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)
    assert server.accepted == 1


@pytest.mark.parametrize(
    "partial", [b"", b"HTTP/1.1 200 OK\r\nContent-Le"], ids=["nothing", "partial-head"]
)
async def test_close_before_complete_head_is_disconnected(rig, partial):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        if partial:
            peer.send(partial)
            await asyncio.sleep(0.05)
        peer.close()

    server = await rig.server(script)
    pool = rig.pool(server.url)
    with pytest.raises(UpstreamError) as caught:
        await pool.request("POST", "/", [], b"x")
    assert (caught.value.verdict, caught.value.verdict.answer_status) == (
        Verdict.UPSTREAM_DISCONNECTED,
        502,
    )
    assert server.accepted == 1  # a fresh connection: no retry
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "head, first",
    [(CHUNKED_HEAD, http_chunk(b"data: 1\n\n")), (response(b"x" * 100)[:-100], b"x" * 10)],
    ids=["chunked", "content-length"],
)
async def test_mid_body_stall_is_a_read_timeout(rig, head, first):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(head)
        await asyncio.sleep(0.05)
        peer.send(first)  # then silence

    server = await rig.server(script)
    pool = rig.pool(server.url, read_timeout=READ_TIMEOUT)
    conn = await pool.request("GET", "/", [], None)
    sink = Sink()
    conn.push(sink)
    assert await sink.wait() is Verdict.UPSTREAM_READ_TIMEOUT

    assert len(sink.pieces) == 1
    waited = sink.end_time - sink.times[-1]
    assert READ_TIMEOUT - SLACK <= waited < READ_TIMEOUT + LATE
    assert conn.closed
    pool.release(conn)
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)
    await asyncio.sleep(0.05)
    assert sink.ends == [Verdict.UPSTREAM_READ_TIMEOUT]


async def fault_around_push(rig, script, when: str):
    """One GET whose script waits on ``peer.go`` to send the fault; the relay's push() comes
    before the fault ("after-push": the fault arrives while pushing) or after the pool has
    already seen it and closed ("before-push"). Returns (server, pool, conn, sink)."""
    server = await rig.server(script)
    pool = rig.pool(server.url)
    conn = await pool.request("GET", "/", [], None)
    sink = Sink()
    if when == "after-push":
        conn.push(sink)
    server.peers[0].go.set()
    if when == "before-push":
        await wait_for(lambda: conn.closed)
        conn.push(sink)
    return server, pool, conn, sink


@pytest.mark.parametrize("when", ["after-push", "before-push"])
@pytest.mark.parametrize(
    "head, body",
    [
        (CHUNKED_HEAD, http_chunk(b"data: 1\n\n") + b"5\r\nda"),
        (response(b"y" * 50)[:-50], b"y" * 20),
    ],
    ids=["chunked", "content-length"],
)
async def test_mid_body_close_is_disconnected(rig, head, body, when):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(head)
        await peer.go.wait()
        peer.send(body)
        await asyncio.sleep(0.05)
        peer.close()

    server, pool, conn, sink = await fault_around_push(rig, script, when)
    assert await sink.wait() is Verdict.UPSTREAM_DISCONNECTED

    expected = b"data: 1\n\nda" if head is CHUNKED_HEAD else b"y" * 20
    assert sink.data == expected
    pool.release(conn)
    await asyncio.sleep(0.05)
    assert sink.ends == [Verdict.UPSTREAM_DISCONNECTED] and not pool._idle


@pytest.mark.parametrize("when", ["after-push", "before-push"])
async def test_invalid_body_framing_is_invalid_response(rig, when):
    """A broken chunk after the head: the body ends with upstream_invalid_response (never a
    clean end), whether the bad bytes arrive before or after the relay called push()."""

    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD)
        await peer.go.wait()
        peer.send(http_chunk(b"good"))
        await asyncio.sleep(0.05)
        peer.send(b"zz\r\nbad\r\n")

    server, pool, conn, sink = await fault_around_push(rig, script, when)
    end = await sink.wait()
    pool.release(conn)
    await asyncio.sleep(0.05)

    assert sink.data == b"good"
    assert end is Verdict.UPSTREAM_INVALID_RESPONSE
    assert len(sink.ends) == 1
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)


# -- 6. the lazy read timer ----------------------------------------------------------------


async def test_steady_trickle_longer_than_the_timeout_is_not_a_timeout(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD)
        for i in range(10):
            await asyncio.sleep(0.1)
            peer.send(http_chunk(b"data: %d\n\n" % i))
        await asyncio.sleep(0.1)
        peer.send(LAST_CHUNK)

    server = await rig.server(script)
    pool = rig.pool(server.url, read_timeout=READ_TIMEOUT)
    start = now()
    conn, sink = await fetch(pool)
    pool.release(conn)

    assert sink.ends == [None]
    assert sink.data == b"".join(b"data: %d\n\n" % i for i in range(10))
    assert now() - start >= 1.0  # it really lasted longer than three timeouts
    assert pool._idle == [conn]  # complete: pooled


async def test_paused_time_is_not_idle_time(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD + http_chunk(b"one "))
        await asyncio.sleep(0.1)
        peer.send(http_chunk(b"two "))  # arrives while we are paused: waits in the kernel
        await asyncio.sleep(0.1)
        peer.send(http_chunk(b"three") + LAST_CHUNK)
        await serve(OK)(peer)

    server = await rig.server(script)
    pool = rig.pool(server.url, read_timeout=READ_TIMEOUT)
    conn = await pool.request("GET", "/", [], None)
    sink = Sink(on_body=lambda piece: conn.pause_reading())  # a client that never drains
    conn.push(sink)
    await wait_for(lambda: sink.pieces)
    paused_at = now()
    await asyncio.sleep(2 * READ_TIMEOUT)
    assert now() - paused_at >= 2 * READ_TIMEOUT
    assert sink.ends == [] and not conn.closed  # no timeout while paused
    assert sink.data == b"one "  # nothing read while paused

    sink._on_body = None
    conn.resume_reading()
    assert await sink.wait() is None
    assert sink.data == b"one two three"
    pool.release(conn)
    assert pool._idle == [conn]

    conn2, sink2 = await fetch(pool)  # the connection is still good
    pool.release(conn2)
    assert conn2 is conn and sink2.data == b"ok" and server.accepted == 1


async def test_idle_clock_restarts_at_resume(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD + http_chunk(b"only"))  # then silence

    server = await rig.server(script)
    pool = rig.pool(server.url, read_timeout=READ_TIMEOUT)
    conn = await pool.request("GET", "/", [], None)
    sink = Sink()
    conn.push(sink)
    await wait_for(lambda: sink.pieces)
    conn.pause_reading()
    await asyncio.sleep(2 * READ_TIMEOUT)
    assert sink.ends == []
    resumed_at = now()
    conn.resume_reading()
    assert await sink.wait() is Verdict.UPSTREAM_READ_TIMEOUT
    assert READ_TIMEOUT - SLACK <= sink.end_time - resumed_at < READ_TIMEOUT + LATE
    pool.release(conn)


# -- 7. push() -----------------------------------------------------------------------------


async def test_pieces_that_came_before_push_are_delivered_first_in_order(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(CHUNKED_HEAD + http_chunk(b"a"))  # with the head, in one write
        await asyncio.sleep(0.05)
        peer.send(http_chunk(b"b"))
        await asyncio.sleep(0.05)
        peer.send(http_chunk(b"c"))
        await peer.go.wait()
        peer.send(http_chunk(b"d"))
        await asyncio.sleep(0.05)
        peer.send(http_chunk(b"e") + LAST_CHUNK)

    server = await rig.server(script)
    pool = rig.pool(server.url)
    conn = await pool.request("GET", "/", [], None)
    await wait_for(
        lambda: b"".join(conn._early) == b"abc"
    )  # a, b and c arrive before the relay is ready
    sink = Sink()
    conn.push(sink)
    assert sink.data == b"abc"  # delivered inside push(), in order
    assert sink.ends == []
    server.peers[0].go.set()
    assert await sink.wait() is None
    assert sink.data == b"abcde"
    pool.release(conn)
    assert pool._idle == [conn]


async def test_response_complete_before_push_ends_from_push(rig):
    server = await rig.server(serve(response(b"all of it")))  # head and body in one write
    pool = rig.pool(server.url)
    conn = await pool.request("GET", "/", [], None)
    await wait_for(lambda: conn.parser.done)  # the whole response is in
    sink = Sink()
    conn.push(sink)
    assert (sink.data, sink.ends) == (b"all of it", [None])  # before push() returned
    assert sink.lasts == [1]  # the body and its end in one call: one write to the client
    pool.release(conn)
    conn2, _ = await fetch(pool)
    pool.release(conn2)
    assert conn2 is conn and server.accepted == 1
    assert sink.ends == [None]


async def test_complete_response_waiting_for_push_is_not_a_read_timeout(rig):
    """The body arrived whole with the head; the relay calls push() later than read_timeout
    (e.g. a slow prepare()). Nothing is idle: the upstream sent everything."""
    server = await rig.server(serve(response(b"all of it")))
    pool = rig.pool(server.url, read_timeout=READ_TIMEOUT)
    conn = await pool.request("GET", "/", [], None)
    await asyncio.sleep(2 * READ_TIMEOUT)
    sink = Sink()
    conn.push(sink)
    assert sink.data == b"all of it"
    assert sink.ends == [None]
    pool.release(conn)


async def test_close_delimited_body_complete_before_push(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        peer.close()

    server = await rig.server(script)
    pool = rig.pool(server.url)
    conn = await pool.request("GET", "/", [], None)
    await wait_for(lambda: conn.closed)
    sink = Sink()
    conn.push(sink)
    assert (sink.data, sink.ends) == (b"until the end", [None])
    pool.release(conn)
    assert not pool._idle


async def test_head_request_has_no_body_despite_content_length(rig):
    server = await rig.server(serve(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", OK))
    pool = rig.pool(server.url)
    conn = await pool.request("HEAD", "/", [], None)
    assert conn.head.status == 200 and conn.head.get("content-length") == "1234"
    sink = Sink()
    conn.push(sink)
    assert (sink.pieces, sink.ends) == ([], [None])
    pool.release(conn)

    conn2, sink2 = await fetch(pool)  # the connection is in step: no 1234 bytes expected
    pool.release(conn2)
    assert conn2 is conn and sink2.data == b"ok" and server.accepted == 1


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
async def test_no_body_statuses_end_at_the_head(rig, status):
    server = await rig.server(serve(b"HTTP/1.1 %b\r\n\r\n" % status, OK))
    pool = rig.pool(server.url)
    conn, sink = await fetch(pool)
    pool.release(conn)
    assert (sink.pieces, sink.ends) == ([], [None])
    conn2, sink2 = await fetch(pool)
    pool.release(conn2)
    assert conn2 is conn and sink2.data == b"ok"


async def test_interim_response_is_skipped(rig):
    server = await rig.server(
        serve(b"HTTP/1.1 100 Continue\r\n\r\n" + response(b"final", b"201 Created"))
    )
    pool = rig.pool(server.url)
    conn, sink = await fetch(pool, "POST", "/", [], b"x")
    pool.release(conn)
    assert conn.head.status == 201 and sink.data == b"final"


# -- 8. bytes while idle -------------------------------------------------------------------


async def test_bytes_while_idle_in_the_pool_retire_the_connection(rig):
    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(OK)
        if peer.index == 0:
            await peer.go.wait()
            peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno")  # answers nothing asked
        await serve(OK)(peer)

    server = await rig.server(script)
    pool = rig.pool(server.url)
    conn1, _ = await fetch(pool)
    pool.release(conn1)
    assert pool._idle == [conn1]
    server.peers[0].go.set()
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)  # we closed it on receipt

    conn2, sink2 = await fetch(pool)
    pool.release(conn2)
    assert conn2 is not conn1 and server.accepted == 2
    assert sink2.data == b"ok"
    assert [len(p.requests) for p in server.peers] == [1, 1]


async def test_bytes_after_the_response_in_the_same_read_retire_the_connection(rig):
    server = await rig.server(serve(OK + b"HTTP/1.1 200 OK\r\n"))
    pool = rig.pool(server.url)
    conn1, sink1 = await fetch(pool)
    assert sink1.data == b"ok" and sink1.ends == [None]
    pool.release(conn1)
    conn2, _ = await fetch(pool)
    pool.release(conn2)
    assert conn2 is not conn1 and server.accepted == 2


# -- 9. an early response to a streamed body -----------------------------------------------


async def test_early_response_before_the_body_was_read_closes_the_connection(rig):
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_head()  # not the body
            peer.send(response(b"large", b"413 Content Too Large"))  # keep-alive, even
            await peer.go.wait()
        else:
            await serve(OK)(peer)

    server = await rig.server(script)
    pool = rig.pool(server.url)
    body = Endless()
    conn = await pool.request("POST", "/upload", [], body)
    assert conn.head.status == 413
    sink = Sink()
    conn.push(sink)
    assert await sink.wait() is None
    assert sink.data == b"large"
    pool.release(conn)

    assert conn.closed and not pool._idle
    taken = body.taken
    await asyncio.sleep(0.1)
    assert body.taken == taken  # the body is no longer read
    server.peers[0].go.set()
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)

    conn2, sink2 = await fetch(pool)
    pool.release(conn2)
    assert conn2 is not conn and sink2.data == b"ok" and server.accepted == 2
    assert sink.ends == [None]


async def test_streamed_body_error_propagates_and_closes(rig):
    class Boom(Exception):
        pass

    class Failing(Chunks):
        async def __anext__(self) -> bytes:
            if self.taken == 1:
                raise Boom
            return await super().__anext__()

    async def script(peer: Peer) -> None:
        await peer.read_head()

    server = await rig.server(script)
    pool = rig.pool(server.url)
    with pytest.raises(Boom):
        await pool.request("POST", "/", [], Failing([b"a", b"b"]))
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)
    assert not pool._all


# -- 10. pool.close() ----------------------------------------------------------------------


async def test_pool_close_closes_idle_and_busy_connections(rig):
    async def script(peer: Peer) -> None:
        while (raw := await peer.read_request()) is not None:
            if raw.startswith(b"GET /slow "):
                peer.send(CHUNKED_HEAD + http_chunk(b"partial"))
                return  # and read until we close
            else:
                peer.send(OK)

    server = await rig.server(script)
    pool = rig.pool(server.url)
    fast1, fast2, slow = await asyncio.gather(
        pool.request("GET", "/1", [], None),
        pool.request("GET", "/2", [], None),
        pool.request("GET", "/slow", [], None),
    )
    assert server.accepted == 3
    sinks = [Sink(), Sink(), Sink()]
    for conn, sink in zip((fast1, fast2, slow), sinks, strict=True):
        conn.push(sink)
    await sinks[0].wait()
    await sinks[1].wait()
    pool.release(fast1)
    pool.release(fast2)
    await wait_for(lambda: sinks[2].pieces)
    assert len(pool._idle) == 2 and len(pool._all) == 3

    await pool.close()
    assert await sinks[2].wait() is Verdict.UPSTREAM_DISCONNECTED
    for peer in server.peers:
        await asyncio.wait_for(peer.eof.wait(), 5)
        assert not peer.closed_by_server
    assert not pool._all and not pool._idle
    assert fast1.closed and fast2.closed and slow.closed

    pool.release(slow)
    await asyncio.sleep(0.05)
    assert [s.ends for s in sinks] == [[None], [None], [Verdict.UPSTREAM_DISCONNECTED]]
    assert sinks[2].data == b"partial"


async def test_release_after_close_does_not_pool(rig):
    server = await rig.server(serve(OK))
    pool = rig.pool(server.url)
    conn = await pool.request("GET", "/", [], None)
    sink = Sink()
    conn.push(sink)
    await pool.close()
    pool.release(conn)
    assert not pool._idle and conn.closed
    await asyncio.wait_for(server.peers[0].eof.wait(), 5)
    assert sink.ends == [None]


async def test_every_stale_idle_connection_is_closed_not_dropped(rig):
    # A burst leaves many idle connections; after the keep-alive time the next request must
    # close every one of them. Closing while iterating the list close() shrinks would skip
    # every other one and then drop it from the pool unclosed: a leaked upstream connection.
    server = await rig.server(serve(OK))
    pool = rig.pool(server.url, keepalive_seconds=0.2)
    burst = 9
    conns = [await pool.request("GET", "/", [], None) for _ in range(burst)]
    for conn in conns:
        sink = Sink()
        conn.push(sink)
        await sink.wait()
        pool.release(conn)
    assert len(pool._idle) == burst and server.accepted == burst
    await asyncio.sleep(0.4)

    conn, _ = await fetch(pool)
    pool.release(conn)

    assert conn not in conns
    await wait_for(lambda: all(p.eof.is_set() for p in server.peers[:burst]), timeout=5.0)
    assert not any(p.closed_by_server for p in server.peers[:burst])
    assert pool._all == {conn} and pool._idle == [conn]


# -- sending at once ---------------------------------------------------------------------


async def test_send_now_writes_the_same_request_at_once_or_nothing(rig):
    server = await rig.server(serve(response(b"one"), response(b"two")))
    pool = rig.pool(server.url)
    headers = [("Content-Type", "application/json"), ("X-Trace", "a")]

    assert (
        pool.send_now("POST", "/v1/x", headers, b"{}") is None
    )  # no idle connection: nothing sent
    conn, sink = await fetch(pool, "POST", "/v1/x", headers, b"{}")
    pool.release(conn)
    sent = pool.send_now("POST", "/v1/x", headers, b"{}")
    assert sent is not None and sent.conn is conn
    await wait_for(
        lambda: len(server.requests) == 2, timeout=5.0
    )  # written before any await of ours
    answered = await pool.response(sent)
    sink2 = Sink()
    answered.push(sink2)
    await sink2.wait()
    pool.release(answered)

    assert answered is conn and sink2.data == b"two"
    assert server.requests[0] == server.requests[1]  # byte for byte what request() sends


async def test_send_now_with_on_head_tells_the_head_from_the_read_that_completed_it(rig):
    """The relay's way (upstream_request.py): the head is told inside the connection's read,
    with the body bytes of that read kept for the sink, and the waiter is left alone."""
    server = await rig.server(serve(response(b"one"), response(b"two")))
    pool = rig.pool(server.url)
    conn, _ = await fetch(pool)
    pool.release(conn)
    told: list[tuple[object, bool]] = []
    real = conn.data_received
    reading = False

    def data_received(data: bytes) -> None:
        nonlocal reading
        reading = True
        try:
            real(data)
        finally:
            reading = False

    conn.data_received = data_received  # type: ignore[method-assign]
    sent = pool.send_now("GET", "/", [], None, lambda c: told.append((c.head.status, reading)))
    assert sent is not None
    await wait_for(lambda: told, timeout=5.0)
    assert told == [(200, True)] and not sent.waiter.done()  # in the read; no future resolved
    sink = Sink()
    conn.push(sink)
    assert await sink.wait() is None and sink.data == b"two"
    pool.release(conn)


async def test_send_now_with_on_head_still_retries_a_stale_connection_through_its_waiter(rig):
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_request()
            peer.send(OK)
            await peer.go.wait()
        else:
            await serve(response(b"fresh"))(peer)

    server = await rig.server(script)
    pool = rig.pool(server.url)
    conn1, _ = await fetch(pool)
    pool.release(conn1)
    server.peers[0].hard_close()
    told: list[object] = []
    sent = pool.send_now("GET", "/again", [], None, told.append)
    assert sent is not None
    conn2 = await pool.response(sent)  # the waiter failed: the pool's one retry
    assert conn2 is not conn1 and told == [] and conn1.closed
    sink = Sink()
    conn2.push(sink)
    assert await sink.wait() is None and sink.data == b"fresh"
    pool.release(conn2)


async def test_the_read_that_ends_a_chunked_body_comes_with_the_end(rig):
    """A stream's last event and the body's last chunk in one read reach the relay in one
    call (``BodySink.last``), so the client gets them in one write."""

    async def script(peer: Peer) -> None:
        await peer.read_request()
        peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await peer.go.wait()
        peer.send(b"3\r\none\r\n")
        await asyncio.sleep(0.05)
        peer.send(b"6\r\n[DONE]\r\n0\r\n\r\n")

    server = await rig.server(script)
    pool = rig.pool(server.url)
    conn = await pool.request("GET", "/", [], None)
    sink = Sink()
    conn.push(sink)
    server.peers[0].go.set()
    assert await sink.wait() is None
    assert sink.data == b"one[DONE]"
    assert sink.lasts == [1] and sink.ends == [None]
    assert sink.frames[-1] == b"6\r\n[DONE]\r\n0\r\n\r\n"  # the read as received
    pool.release(conn)
    assert pool._idle == [conn]
