"""Whether a client is still taking its response: one rule, timed from the last byte it took.

A client that takes no byte of a response for ``send_timeout`` seconds is let go (nginx's
``send_timeout``): the upstream request is closed, so the server stops generating for a
reader that stopped. Any progress moves the deadline, so a slow but live reader keeps its
stream. The rule is the same while the response is written, while the upstream is paused
for a full client buffer, and after the last byte while the client takes what is queued.

What the client has taken is what was written to it minus what is still unsent: the
transport's buffer plus the kernel's unacknowledged send queue (Linux ``SIOCOUTQ``). The
transport's buffer alone cannot tell: the kernel's send buffer grows to MiBs and absorbs a
paced token stream for minutes before a write ever queues. Progress is seen at checks
(:attr:`ClientPace.every` apart), so a reader that stopped is let go within
``send_timeout`` and one check of the last byte it took.
"""

from __future__ import annotations

import asyncio
import struct

try:  # the kernel's unsent-bytes count of a socket (Linux, also macOS as TIOCOUTQ)
    import fcntl
    from termios import TIOCOUTQ

    _SIOCOUTQ: int | None = TIOCOUTQ
except ImportError:  # pragma: no cover - Windows: progress is seen in the transport buffer only
    fcntl = None  # type: ignore[assignment]  # no module there: _SIOCOUTQ None guards its use
    _SIOCOUTQ = None

__all__ = ["SEND_TIMEOUT", "ClientPace", "unsent"]

SEND_TIMEOUT = 60.0
"""Seconds a client may take no bytes at all of a response that waits for it (nginx's
``send_timeout`` and its default)."""

CHECKS_PER_TIMEOUT = 12
CHECK_MAX_SECONDS = 5.0
"""How often, at most, the kernel is asked whether the client took anything: twelve times per
``send_timeout``, and at least every 5 s (the default 60 s: every 5 s). Each check is a
system call the token lane leaves to Python, so it is paced, not made per write."""


def unsent(transport: asyncio.Transport) -> int:
    """Bytes not yet taken by the client: the transport's buffer plus the kernel's send
    queue. The kernel queue is what shows a slow reader's progress: the transport's buffer
    only shrinks once a third of the socket buffer is free, which a reader taking a few KiB
    a second may not reach in minutes."""
    queued = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None and _SIOCOUTQ is not None:
        try:
            queued += struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            pass
    return queued


class ClientPace:
    """The client's progress on one response. ``written`` counts every byte written to the
    client from the response's start; :meth:`alive` is the one check, made when
    :attr:`check_at` is due (at a write, or from a timer while nothing is written)."""

    __slots__ = ("_transport", "timeout", "every", "check_at", "written", "_taken", "_taken_at")

    def __init__(self, transport: asyncio.Transport, timeout: float, now: float) -> None:
        self._transport = transport
        self.timeout = timeout
        self.every = min(timeout / CHECKS_PER_TIMEOUT, CHECK_MAX_SECONDS)
        self.check_at = now + self.every
        self.written = 0
        self._taken: int | None = None  # bytes taken as of the last progress seen
        self._taken_at = now

    def alive(self, now: float) -> bool:
        """Whether the client took a byte in the last ``timeout`` seconds (or has nothing
        left to take); the next check is due at :attr:`check_at`."""
        queued = unsent(self._transport)
        taken = self.written - queued
        if not queued or self._taken is None or taken > self._taken:
            self._taken, self._taken_at = taken, now
        elif now - self._taken_at >= self.timeout:
            return False
        self.check_at = min(now + self.every, self._taken_at + self.timeout)
        return True

    def wait(self, now: float) -> float:
        """Seconds until the next check is due."""
        return max(self.check_at - now, 0.0)
