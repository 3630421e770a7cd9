"""README's path, with real processes: ``llm-sidecar simulate`` behind ``llm-sidecar serve``.
With ``--enable-force-include-usage`` the simulator puts usage in every stream, as vLLM does
with that flag, so the sidecar's request record counts tokens from ``usage``; without it a
client that does not ask for usage leaves the sidecar to estimate."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from tests.support.processes import stop_process
from tests.support.serve import ServeProcess, start_simulator

pytestmark = pytest.mark.integration

MODEL = "sim-llama-3-8b"
EXACT = {"x-sim-ttft": "0.01", "x-sim-tpot": "0.005", "x-sim-tokens": "6"}
REQUESTS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}),
    ("/v1/completions", {"prompt": "Hello"}),
]


def _post_stream(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **EXACT},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
        data: bytes = resp.read()
    return data


def _records(sidecar: ServeProcess, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The sidecar's ``request`` log records, once ``count`` of them are written."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for line in [*sidecar.out, *sidecar.err]:
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("event") == "request":
                    found.append(record)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("flags", "source"),
    [(("--enable-force-include-usage",), "usage"), ((), "estimated")],
    ids=["force-include-usage", "default"],
)
def test_the_record_counts_tokens_from_usage_only_with_the_switch(flags, source):
    simulator, sim_port = start_simulator("--model", MODEL, *flags)
    try:
        sidecar = ServeProcess(f"http://127.0.0.1:{sim_port}", "--log-format", "json")
    except BaseException:
        stop_process(simulator)
        raise
    try:
        port, _ = sidecar.ports()
        bodies = []
        for path, extra in REQUESTS:  # streamed; neither asks for usage
            bodies.append(
                _post_stream(f"http://127.0.0.1:{port}{path}", {"model": MODEL, "stream": True, **extra})
            )  # fmt: skip
        records = _records(sidecar, len(REQUESTS))
    finally:
        out, err = sidecar.stop()
        stop_process(simulator)
    assert len(records) == len(REQUESTS), out + err
    assert all(b.endswith(b"data: [DONE]\n\n") for b in bodies)
    # the bytes the client got: usage in them only with the switch
    assert [b'"usage":{"prompt_tokens"' in b for b in bodies] == [source == "usage"] * 2
    for record, (path, _) in zip(records, REQUESTS, strict=True):
        assert record["route"] == path and record["stream"] is True
        assert record["outcome"] == "ok"
        assert record["tokens_source"] == source, record
        assert record["output_tokens"] == 6, record
        if source == "usage":
            assert record["input_tokens"] and record["input_tokens"] > 0, record
