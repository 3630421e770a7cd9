"""The Python floor: a plain uvloop TCP byte relay with no HTTP parsing and no measuring.

Each client connection gets its own upstream connection and bytes are copied both ways
from ``data_received`` straight to the other transport's ``write`` (with flow control).
It is not a proxy anyone should deploy; it is the cheapest thing Python can do per token,
so the benchmark can show how much of the sidecar's cost is Python itself versus its HTTP
layers and its measuring (``--targets direct,nginx,pyrelay,sidecar``).

Run: ``python -m bench.pyrelay --port P --upstream-port U``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys


class _Half(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc) -> None:
        self.transport = None
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # the peer's write buffer is full: stop reading from this side
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Downstream(_Half):
    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self._upstream = upstream

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.pause_reading()
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(_Half, *self._upstream)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        if self.transport is None:
            up.transport.close()
            return
        self.peer, up.peer = up, self
        for data in self.pending:
            up.transport.write(data)
        self.pending.clear()
        self.transport.resume_reading()


async def serve(port: int, upstream: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Downstream(upstream), "127.0.0.1", port, backlog=4096
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pyrelay", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    args = p.parse_args(argv)
    import uvloop  # noqa: PLC0415

    uvloop.run(serve(args.port, ("127.0.0.1", args.upstream_port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
