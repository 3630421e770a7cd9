"""Early.abandon (sidecar/relay/data/early.py) for each way a request can be on its way: written
on a pooled connection, a task still connecting, a task that already has its answer, or a
task that failed; the request is recorded only if it was written."""

from __future__ import annotations

import asyncio

from sidecar.relay.data.early import Early


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
