"""A request on its way to the upstream, from the exchange's one question to its answer: the
connection the answer's head came in on, or why there is none.

The exchange (sidecar/relay/data/exchange.py) owns a request leg's state and its verdict;
how the pool is asked is this module's: written at once on an idle pooled connection, with
no await (its answer's head told from the connection's read that completed it, so the relay
takes the response in that read, with no loop turn before its first byte), else a task that
connects and sends it, one that streams a body as it comes, or the pool's one retry on a
fresh connection when the pooled one was closed under the request
(:meth:`~sidecar.relay.data.upstream.UpstreamPool.response`). Either way the exchange hears
once, from a callback: ``on_answer(conn)`` or ``on_failure(error)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .http1 import ResponseHead
    from .upstream import Sent, UpstreamConnection, UpstreamPool

__all__ = ["UpstreamRequest"]


class UpstreamRequest:
    """One request asked of ``pool``, answered once through ``on_answer`` (the connection
    its answer's head came in on) or ``on_failure`` (why there is none) unless :meth:`cancel`
    came first; ``on_sent`` is called when a task wrote a whole (or no) body
    (the exchange notes the time; :meth:`send` says so itself when it wrote at once).
    ``written_at_once``: :meth:`send` found an idle pooled connection."""

    __slots__ = (
        "_pool", "_on_answer", "_on_failure", "_on_sent", "_sent", "_pending", "_over",
        "written_at_once",
    )  # fmt: skip

    def __init__(
        self,
        pool: UpstreamPool,
        on_answer: Callable[[UpstreamConnection], None],
        on_failure: Callable[[BaseException], None],
        on_sent: Callable[[], None],
    ) -> None:
        self._pool = pool
        self._on_answer = on_answer
        self._on_failure = on_failure
        self._on_sent = on_sent
        self._sent: Sent | None = None  # written at once on a pooled connection: its answer
        self._pending: asyncio.Future[UpstreamConnection] | None = None  # a task's answer
        self._over = False  # answered or cancelled: nothing more is asked or told
        self.written_at_once = False

    def send(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes | None
    ) -> bool:
        """Ask with a whole (or no) body; True when it was written at once. Raises
        ValueError for a field line that cannot be written (nothing was)."""
        sent = self._pool.send_now(method, target, headers, body, self._head_now)
        if sent is None:
            self._await(self._pool.request(method, target, headers, body, self._on_sent))
            return False
        self._sent = sent
        self.written_at_once = True
        sent.waiter.add_done_callback(self._head_in)
        return True

    def stream(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: AsyncIterable[bytes],
    ) -> None:
        """Ask with a body sent as it comes, from a task."""
        self._await(self._pool.request(method, target, headers, body))

    def cancel(self) -> None:
        """The answer is for nobody (the request ended before it): a connection written on
        is closed, so the server stops generating, and a task is cancelled (the pool closes
        the connection it was using)."""
        if self._over:
            return
        self._over = True
        if self._sent is not None:
            self._sent.conn.close()
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()

    def _await(self, answer: Coroutine[object, object, UpstreamConnection]) -> None:
        self._pending = pending = asyncio.ensure_future(answer)
        pending.add_done_callback(self._answered)

    def _head_now(self, conn: UpstreamConnection) -> None:
        """The head of the answer on the pooled connection, from the read that completed it."""
        if not self._over:
            self._over = True
            self._on_answer(conn)

    def _head_in(self, waiter: asyncio.Future[ResponseHead]) -> None:
        """The answer on the pooled connection failed before its head (or, for a pool that
        answers through the waiter, its head arrived)."""
        failed = waiter.cancelled() or waiter.exception() is not None
        sent = self._sent
        if self._over or sent is None:
            return
        if failed:  # the pool decides (a reused connection closed under it: once more)
            self._await(self._pool.response(sent))
            return
        self._over = True
        self._on_answer(sent.conn)

    def _answered(self, pending: asyncio.Future[UpstreamConnection]) -> None:
        if pending.cancelled():
            return
        error = pending.exception()
        if self._over:  # cancelled meanwhile: the connection is for nobody
            if error is None:
                pending.result().close()
            return
        self._over = True
        if error is None:
            self._on_answer(pending.result())
        else:
            self._on_failure(error)
