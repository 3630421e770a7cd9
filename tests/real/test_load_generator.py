"""A real load generator from PyPI (aiperf, installed by scripts/install-aiperf.sh) runs
streamed chat requests through the sidecar against real vLLM: the sidecar's ``ok`` count
equals the generator's own count of successful requests, and nothing is ``cancelled``.

aiperf, like vLLM's benchmark, stops reading a stream at ``data: [DONE]`` and closes the
connection before the HTTP response's terminating chunk. Filed as ``cancelled`` (that close
can land before the sidecar has finished relaying; 8 to 17 of 30 such requests), they would
fall out of availability, goodput and the ``ok`` latency figures.

aiperf needs no network: its tokenizer is the tiny model's folder, loaded from disk. Not
with HF_HUB_OFFLINE=1: aiperf 0.13 then resolves every tokenizer name as a Hub cache entry
and refuses a local path (``HFValidationError: Repo id must be in the form ...``); without
it a path is loaded as a path. It is a subprocess; the sidecar runs in the test's event
loop, in front of the session's vLLM.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from tests.real.servers import AIPERF, HF_MODEL, VLLM, require_aiperf
from tests.support.samples import outcome_counts
from tests.support.waits import wait_for

pytestmark = pytest.mark.real

REQUESTS = 30
OUTPUT_TOKENS = 32
ROUTE = "/v1/chat/completions"


def generator_counts(artifacts) -> tuple[int, int]:
    """(successful, failed) requests as aiperf counted them, from its per-request records."""
    (records,) = list(artifacts.rglob("profile_export.jsonl"))
    ok = failed = 0
    for line in records.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("error"):
            failed += 1
        else:
            ok += 1
    return ok, failed


async def test_aiperf_successes_are_the_sidecars_ok(live_servers, sidecar_factory, tmp_path):
    require_aiperf()
    server = live_servers.get(VLLM)
    running = await sidecar_factory(server.url)
    artifacts = tmp_path / "aiperf"
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
    process = await asyncio.create_subprocess_exec(
        str(AIPERF), "profile",
        "--model", "tiny", "--tokenizer", str(HF_MODEL),
        "--url", running.url, "--endpoint-type", "chat", "--streaming",
        "--request-count", str(REQUESTS), "--concurrency", "4",
        "--isl", "32", "--isl-stddev", "0", "--osl", str(OUTPUT_TOKENS), "--osl-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{OUTPUT_TOKENS}",
        "--random-seed", "1", "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
        "--export-level", "records", "--artifact-dir", str(artifacts),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), timeout=600)
    assert process.returncode == 0, output.decode(errors="replace")[-4000:]

    ok, failed = generator_counts(artifacts)
    assert (ok, failed) == (REQUESTS, 0), output.decode(errors="replace")[-4000:]
    # Every request is filed just after its connection ends; the generator may exit first.
    await wait_for(lambda: sum(outcome_counts(running.registry).values()) == REQUESTS, timeout=30)
    assert outcome_counts(running.registry) == {"ok": ok}
    # And each was measured as the generator asked: 32 output tokens, by vLLM's usage or the stream.
    outputs = running.sample("llm_tokens_total", model="tiny", route=ROUTE, type="output")
    assert outputs == REQUESTS * OUTPUT_TOKENS
