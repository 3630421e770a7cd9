"""Records genuine response bodies from real inference servers as test fixtures.

For each server kind (vLLM 0.32 with default flags, with ``--enable-force-include-usage``,
with ``--enable-per-request-metrics``; llama.cpp; ``transformers serve``) this starts the server from the repo's
cached install, asks every case of ``tests/real/servers.py`` (each route, streamed or not,
with or without ``stream_options.include_usage``) and writes:

  tests/fixtures/real/<engine>-<version><variant>/<case>.sse|.json   the body bytes exactly as
                                                                    the client receives them
                                                                    (HTTP chunking removed)
  tests/fixtures/real/<engine>-<version><variant>/<case>.meta.json  request, status, headers
  tests/fixtures/real/<engine>-<version><variant>/metrics.txt       the server's /metrics text
                                                                    (transformers serve has none)

The fast unit tests (tests/unit/streams/test_real_recordings.py) replay these bytes through the
sidecar's dialects; the simulator's fidelity test compares its output shape with them.
Prompts are fixed and the model is a tiny random one, so nothing private is recorded.

Usage: .venv/bin/python scripts/record-real-streams.py [KIND ...]
       (kinds: vllm vllm-force-usage vllm-per-request-metrics llama.cpp transformers-serve;
       default all)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.real.servers import KINDS, Case, RealServer, cases, start  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "real"


async def fetch(
    session: aiohttp.ClientSession, base: str, case: Case, model: str
) -> tuple[int, dict, bytes]:
    """The response's status, headers and body bytes as received, nothing decoded."""
    async with session.post(base + case.route, json=case.body(model)) as resp:
        body = b"".join([chunk async for chunk in resp.content.iter_any()])
        return resp.status, dict(resp.headers), body


def extension(headers: dict) -> str:
    mime = headers.get("Content-Type", headers.get("content-type", "")).split(";", 1)[0].strip()
    return "sse" if mime == "text/event-stream" else "json"


async def record(server: RealServer) -> Path:
    version = server.version()
    folder = OUT / server.kind.fixture_dir(version)
    folder.mkdir(parents=True, exist_ok=True)
    # One connection per request: llama.cpp closes a kept-alive connection after a stream,
    # and a reused one would race that close.
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, timeout=timeout
    ) as session:
        for case in cases(server.kind):
            status, headers, body = await fetch(session, server.url, case, server.kind.model)
            for stale in folder.glob(f"{case.name}.*"):
                stale.unlink()
            (folder / f"{case.name}.{extension(headers)}").write_bytes(body)
            meta = {
                "server": {
                    "engine": server.kind.engine,
                    "version": version,
                    "flags": list(server.kind.flags),
                },
                "request": {
                    "method": "POST",
                    "path": case.route,
                    "body": case.body(server.kind.model),
                },
                "response": {"status": status, "headers": headers},
            }
            (folder / f"{case.name}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            print(f"  {case.name}: {status} {len(body)} bytes")
    if server.kind.engine != "transformers":  # transformers serve has no /metrics
        (folder / "metrics.txt").write_text(server.get_text("/metrics"))
    return folder


def main(argv: list[str]) -> int:
    names = argv or list(KINDS)
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        print(f"unknown server kind(s) {unknown}; choose from {list(KINDS)}", file=sys.stderr)
        return 2
    for name in names:
        kind = KINDS[name]
        why = kind.missing()
        if why:
            print(f"{name}: skipped: {why}", file=sys.stderr)
            continue
        server = start(kind)
        try:
            server.wait_ready()
            print(f"{name}: ready after {server.ready_after:.0f} s on {server.url}")
            t0 = time.monotonic()
            folder = asyncio.run(record(server))
            print(
                f"{name}: recorded in {time.monotonic() - t0:.1f} s -> {folder.relative_to(ROOT)}"
            )
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
