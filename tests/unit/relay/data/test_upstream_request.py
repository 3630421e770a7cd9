"""How a request is asked of the pool (sidecar/relay/data/upstream_request.py): written at
once or by a task, the pool's retry when the pooled connection failed under it, and nothing
told or retried once the request was cancelled (the exchange ended before its answer)."""

from __future__ import annotations

import asyncio

from sidecar.base.outcomes import Verdict
from sidecar.relay.data.upstream import Sent, UpstreamError
from sidecar.relay.data.upstream_request import UpstreamRequest


class Conn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Pool:
    """Idle connections to write on at once (``idle``), and the answers of its tasks."""

    def __init__(self, idle: bool) -> None:
        self.idle = idle
        self.conn = Conn()
        self.waiter: asyncio.Future | None = None
        self.asked: list[str] = []

    def send_now(self, method, target, headers, body, on_head=None):
        if not self.idle:
            return None
        self.on_head = on_head  # what the connection calls from the read with the head
        self.waiter = asyncio.get_running_loop().create_future()
        return Sent(self.conn, self.waiter, method, b"head", body, True)  # type: ignore[arg-type]

    async def request(self, method, target, headers, body, on_sent=None):
        self.asked.append("request")
        if on_sent is not None:
            on_sent()
        return self.conn

    async def response(self, sent):
        self.asked.append("response")
        return self.conn


def asking(pool: Pool) -> tuple[UpstreamRequest, list, list]:
    answers: list = []
    sent: list = []
    return (
        UpstreamRequest(
            pool,  # type: ignore[arg-type]
            lambda conn: answers.append((conn, None)),
            lambda error: answers.append((None, error)),
            lambda: sent.append(1),
        ),
        answers,
        sent,
    )


async def test_written_at_once_is_answered_from_the_read_with_its_head():
    pool = Pool(idle=True)
    asked, answers, sent = asking(pool)
    assert asked.send("POST", "/", [], b"{}") is True and asked.written_at_once
    pool.on_head(pool.conn)
    assert answers == [(pool.conn, None)] and sent == []  # at once; the exchange noted the time
    pool.on_head(pool.conn)  # (a connection tells once; a second is not a second answer)
    await asyncio.sleep(0)
    assert answers == [(pool.conn, None)]
    asked.cancel()  # answered: nothing to stop
    assert not pool.conn.closed


async def test_no_idle_connection_is_asked_from_a_task():
    pool = Pool(idle=False)
    asked, answers, sent = asking(pool)
    assert asked.send("POST", "/", [], b"{}") is False and not asked.written_at_once
    await asyncio.sleep(0.01)
    assert answers == [(pool.conn, None)] and sent == [1] and pool.asked == ["request"]


async def test_a_pooled_connection_failed_under_it_is_the_pools_to_retry():
    pool = Pool(idle=True)
    asked, answers, _ = asking(pool)
    asked.send("GET", "/", [], None)
    pool.waiter.set_exception(UpstreamError(Verdict.UPSTREAM_DISCONNECTED, "gone"))
    await asyncio.sleep(0.01)
    assert pool.asked == ["response"] and answers == [(pool.conn, None)]


async def test_cancelled_before_its_answer_the_connection_closes_and_nothing_is_retried():
    pool = Pool(idle=True)
    asked, answers, _ = asking(pool)
    asked.send("GET", "/", [], None)
    asked.cancel()
    assert pool.conn.closed  # the server stops generating for nobody
    pool.waiter.set_exception(UpstreamError(Verdict.UPSTREAM_DISCONNECTED, "closed"))
    await asyncio.sleep(0.01)
    assert answers == [] and pool.asked == []  # no retry for a request nobody waits for


async def test_cancelled_while_a_task_connects_the_task_is_cancelled_and_nothing_told():
    pool = Pool(idle=False)
    hold = asyncio.Event()

    async def request(method, target, headers, body, on_sent=None):
        await hold.wait()
        return pool.conn

    pool.request = request  # type: ignore[method-assign]
    asked, answers, _ = asking(pool)
    asked.send("POST", "/", [], b"{}")
    await asyncio.sleep(0)
    asked.cancel()
    hold.set()
    await asyncio.sleep(0.01)
    assert answers == [] and asked._pending is not None and asked._pending.cancelled()


async def test_a_task_that_fails_tells_why():
    pool = Pool(idle=False)
    error = UpstreamError(Verdict.UPSTREAM_UNREACHABLE, "refused")

    async def request(method, target, headers, body, on_sent=None):
        raise error

    pool.request = request  # type: ignore[method-assign]
    asked, answers, sent = asking(pool)
    asked.send("POST", "/", [], b"{}")
    await asyncio.sleep(0.01)
    assert answers == [(None, error)] and sent == []
