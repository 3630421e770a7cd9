"""Bounded memory per request, whatever the client sends (issue 17, item 1).

A ``serve`` subprocess in front of a raw upstream that reads the whole request and answers
with a short stream; the peak (``VmHWM``) and current RSS of the sidecar process are read
from /proc. The bodies are the probe's: 33 MB of one million small chat messages, and 33 MB
of ``[{},{},...]``. Parsing them whole held 450 and 874 MiB (peaks 563 and 1,073) for the
whole stream, past the chart's 512Mi limit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.integration.test_faults import serve_process  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

MiB = 1 << 20
CHART_LIMIT = 512 * MiB


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


def reset_peak(pid: int) -> None:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def messages_body() -> bytes:
    return b'{"model":"m","stream":true,"messages":[' + b",".join([b'{"role":"user","content":"x"}'] * 1_100_000) + b"]}"


def empties_body() -> bytes:
    return b"[" + b",".join([b"{}"] * 11_000_000) + b"]"


class DrainingUpstream:
    """Reads each request whole, then answers a short SSE stream, slowly enough that the
    sidecar's memory can be read while the stream is in flight."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.in_stream = asyncio.Event()
        self.finish = asyncio.Event()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                got = 0
                while got < length:
                    got += len(await reader.read(min(1 << 20, length - got)))
                self.received.append(got)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
                writer.write(b"%x\r\n%b\r\n" % (len(event), event))
                self.in_stream.set()
                await self.finish.wait()
                writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (14, b"data: [DONE]\n\n"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def post_raw(port: int, path: bytes, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (path, len(body)))
    view = memoryview(body)
    for i in range(0, len(body), 1 << 20):
        writer.write(view[i : i + (1 << 20)])
        await writer.drain()
    return reader, writer


@pytest.mark.parametrize("make_body", [messages_body, empties_body], ids=["million-messages", "empty-objects"])
async def test_largest_accepted_body_stays_far_below_the_chart_limit(serve_process, make_body):
    up = DrainingUpstream()
    url = await up.start()
    sc = serve_process(url, "--max-request-body-bytes", str(64 * MiB))
    await sc.wait_alive()
    pid = sc.proc.pid
    body = make_body()
    assert 31 * MiB < len(body) <= 32 * MiB  # the largest body read to learn its model
    # Warm the code paths once, then measure from here.
    reader, writer = await post_raw(sc.port, b"/v1/chat/completions", b'{"model":"m","stream":true}')
    await asyncio.wait_for(up.in_stream.wait(), 10)
    up.finish.set()
    await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
    writer.close()
    up.finish.clear()
    up.in_stream.clear()
    await asyncio.sleep(0.2)
    before = proc_status(pid, "VmRSS")
    reset_peak(pid)

    reader, writer = await post_raw(sc.port, b"/v1/chat/completions", body)
    del body
    await asyncio.wait_for(up.in_stream.wait(), 60)
    await asyncio.sleep(0.3)
    during = proc_status(pid, "VmRSS")
    peak = proc_status(pid, "VmHWM")
    up.finish.set()
    data = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
    writer.close()
    up.server.close()

    assert up.received[-1] > 31 * MiB and data.startswith(b"HTTP/1.1 200 ")
    print(f"rss before {before / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, during the stream {during / MiB:.0f} MiB")
    # The raw bytes pass through a few buffers (aiohttp's reader, the joined body, the
    # upstream transport): a few times 33 MB at the peak, never a parsed object.
    assert peak - before < 200 * MiB, (before, peak)
    assert peak < CHART_LIMIT // 2
    # Nothing of the body is kept while the response streams.
    assert during - before < 40 * MiB, (before, during)
