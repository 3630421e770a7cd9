"""What an on-call needs to see, read the way Prometheus reads it: a
simulated inference server behind a sidecar, real sockets both ways, and the admin port's
/metrics page parsed as exposition text.

- an upstream that drops the connection mid-stream, one that ends a stream cleanly before it
  is complete, and one that sends an error event inside a 200 stream all count as
  ``code="200", outcome="error"``; ``error_type`` tells them apart.
- answers cut at ``max_tokens`` (``length``): ``llm_finish_reasons_total`` counts them, in
  each dialect's words folded into one set.
- ``/health``, ``/metrics`` and ``GET /v1/models`` through the proxy port are counted apart,
  not in ``llm_requests_total`` as ``model="unknown", route="other"`` (an SLO of their own).
- the ``process_*`` metrics, the build info, and whether the C speedups are loaded (also in
  ``--version``).
"""

from __future__ import annotations

import subprocess
import sys

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar import __version__
from sidecar.base.finish_reason import FINISH_REASONS
from sidecar.base.outcomes import ERROR_TYPE_LABELS
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from tests.support.in_process import start_app
from tests.support.paths import ROOT
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

MODEL = "sim-llama-3-8b"
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello"}]
# Python with the C extension made unimportable: what a compiler-less install runs.
WITHOUT_SPEEDUPS = (
    sys.executable,
    "-c",
    "import sys; sys.modules['sidecar.base._speedups'] = None; from sidecar.cli import main; sys.exit(main())",
)


async def scrape(admin_url: str) -> list:
    """Every sample of the admin port's /metrics page, as Prometheus would parse it."""
    async with aiohttp.ClientSession() as s:
        async with s.get(admin_url + "/metrics") as r:
            assert r.status == 200
            text = await r.text()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def values(samples: list, name: str, **labels: str) -> dict[tuple, float]:
    """{label values in sorted-name order: value} of the samples of ``name`` matching ``labels``."""
    out = {}
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            out[tuple(s.labels[k] for k in sorted(s.labels))] = s.value
    return out


def label_values(samples: list, name: str, label: str, **labels: str) -> dict[str, float]:
    """{value of ``label``: summed sample value} over the samples of ``name`` matching ``labels``."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            out[s.labels[label]] = out.get(s.labels[label], 0) + s.value
    return out


@pytest.fixture
async def simulated():
    runners = []

    async def start():
        runner, port = await start_app(
            build_simulator_app(SimulatorConfig(ttft=0.01, tpot=0.002, jitter=0, tokens=12, seed=3))
        )
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict, headers: dict | None = None
) -> int:
    try:
        async with session.post(url, json=body, headers=headers or {}) as r:
            await r.read()
            return r.status
    except aiohttp.ClientPayloadError:  # the server dropped the stream: relayed as a cut-off body
        return 200


# -- finding 9 -------------------------------------------------------------------------------------


async def test_a_drop_a_truncated_stream_and_an_in_stream_error_are_told_apart(
    simulated, sidecar_factory, refused_url
):
    sc = await sidecar_factory(await simulated())
    stream = {"model": MODEL, "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as s:
        for fault in ("drop", "truncate", "stream"):
            assert await _post(s, sc.url + CHAT, stream, {"x-sim-fail": fault}) == 200
        assert await _post(s, sc.url + CHAT, stream) == 200
    down = await sidecar_factory(refused_url)
    async with aiohttp.ClientSession() as s:
        assert await _post(s, down.url + CHAT, stream) == 502

    samples = await scrape(sc.admin_url)
    # All three look alike by status and outcome; the cause is what differs.
    failed = label_values(
        samples, "llm_requests_total", "error_type", code="200", outcome="error", route=CHAT
    )
    assert failed == {"upstream_disconnected": 1, "upstream_stream_truncated": 1, "stream_error": 1}
    assert label_values(samples, "llm_requests_total", "error_type", outcome="ok") == {"none": 1}
    unreachable = label_values(
        await scrape(down.admin_url), "llm_requests_total", "error_type", outcome="error"
    )
    assert unreachable == {"upstream_unreachable": 1}
    assert {
        s.labels["error_type"] for s in samples if s.name == "llm_requests_total"
    } <= ERROR_TYPE_LABELS


async def test_a_client_that_leaves_is_cancelled_with_its_cause(simulated, sidecar_factory):
    sc = await sidecar_factory(await simulated())
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(
            sc.url + CHAT, json=body, headers={"x-sim-tpot": "0.2", "x-sim-tokens": "40"}
        ) as r:
            await r.content.readany()
            r.close()  # mid-answer

    async def cancelled() -> dict:
        return label_values(
            await scrape(sc.admin_url), "llm_requests_total", "error_type", outcome="cancelled"
        )

    await wait_for(lambda: cancelled())
    assert await cancelled() == {"client_disconnected": 1}


# -- finding 10 ------------------------------------------------------------------------------------


async def test_answers_cut_at_max_tokens_show_as_length_in_every_dialect(
    simulated, sidecar_factory
):
    sc = await sidecar_factory(await simulated())
    async with aiohttp.ClientSession() as s:
        # OpenAI chat, streamed and whole: finish_reason "stop" and "length".
        for stream in (True, False):
            await _post(s, sc.url + CHAT, {"model": MODEL, "messages": MESSAGES, "stream": stream})
            await _post(
                s,
                sc.url + CHAT,
                {"model": MODEL, "messages": MESSAGES, "stream": stream, "max_tokens": 3},
            )
        # Anthropic Messages: stop_reason "end_turn" and "max_tokens".
        messages = {"model": MODEL, "messages": MESSAGES, "stream": True}
        await _post(s, sc.url + "/v1/messages", {**messages, "max_tokens": 100})
        await _post(s, sc.url + "/v1/messages", {**messages, "max_tokens": 3})
        # Ollama native: done_reason "stop" and "length".
        await _post(s, sc.url + "/api/chat", {"model": MODEL, "messages": MESSAGES})
        await _post(
            s,
            sc.url + "/api/chat",
            {"model": MODEL, "messages": MESSAGES, "options": {"num_predict": 3}},
        )

    samples = await scrape(sc.admin_url)
    for route in (CHAT, "/v1/messages", "/api/chat"):
        reasons = label_values(samples, "llm_finish_reasons_total", "finish_reason", route=route)
        expected = {"stop": 2, "length": 2} if route == CHAT else {"stop": 1, "length": 1}
        assert reasons == expected, (route, reasons)
    assert {
        s.labels["finish_reason"] for s in samples if s.name == "llm_finish_reasons_total"
    } <= set(FINISH_REASONS)


# -- finding 11 ------------------------------------------------------------------------------------


async def test_health_checks_and_listings_through_the_proxy_port_are_not_slo_requests(
    simulated, sidecar_factory
):
    sc = await sidecar_factory(await simulated())
    async with aiohttp.ClientSession() as s:
        for path in ("/health", "/metrics", "/v1/models", "/health"):
            async with s.get(sc.url + path) as r:
                assert r.status == 200
                await r.read()
        assert (
            await _post(s, sc.url + CHAT, {"model": MODEL, "messages": MESSAGES, "stream": True})
            == 200
        )

    samples = await scrape(sc.admin_url)
    # Only the API request is an SLO request: no model "unknown" / route "other" series to
    # form an SLO of its own (the SLO rules sum llm_requests_total and the SLI histograms).
    for name in ("llm_requests_total", "llm_requests_in_flight"):
        routes = {s.labels["route"] for s in samples if s.name == name}
        assert routes <= {CHAT}, (name, routes)
    for name in (
        "llm_request_duration_seconds_count",
        "llm_time_to_first_byte_seconds_count",
        "llm_requests_within_slo_total",
    ):
        models = {s.labels["model"] for s in samples if s.name == name}  # per model, no route
        assert models <= {MODEL}, (name, models)
    assert sum(values(samples, "llm_requests_total").values()) == 1
    assert values(samples, "llm_non_api_requests_total") == {("200", "GET", "ok"): 4}


# -- finding 12 ------------------------------------------------------------------------------------


async def test_the_sidecar_exports_its_own_process_and_build(simulated, sidecar_factory):
    from sidecar.base.speedups import IN_C

    sc = await sidecar_factory(await simulated())
    samples = await scrape(sc.admin_url)
    own = {s.name: s.value for s in samples if s.name.startswith("process_")}
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
    ):
        assert own.get(name, 0) > 0, (name, own)
    (build,) = [s for s in samples if s.name == "llm_sidecar_build_info"]
    assert build.value == 1
    assert build.labels["version"] == __version__
    assert build.labels["python"] == ".".join(map(str, sys.version_info[:3]))
    assert build.labels["speedups"] == ("on" if IN_C else "off")


async def test_without_the_c_speedups_the_start_line_the_build_info_and_version_say_so(
    simulated, serve_process
):
    """A compiler-less install (the extension cannot be imported) runs at about 2x the CPU:
    it must say so where an operator looks: ``--version``, the start line, the build info."""
    version = subprocess.run(
        [*WITHOUT_SPEEDUPS, "--version"], capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0, version.stderr
    first, warning = version.stdout.strip().splitlines()
    assert first.startswith(f"llm-sidecar {__version__} (Python ") and first.endswith(
        "C speedups off)"
    )
    assert (
        warning.startswith("warning: the C speedups are not loaded") and "twice the CPU" in warning
    )

    p = serve_process(
        await simulated(), "--log-format", "json", command=WITHOUT_SPEEDUPS, clean_env=True
    )
    await p.wait_started()
    samples = await scrape(p.admin_url)
    (build,) = [s for s in samples if s.name == "llm_sidecar_build_info"]
    assert build.labels["speedups"] == "off"
    out, err = p.stop()
    logs = out + err
    assert '"speedups": "off"' in logs or '"speedups":"off"' in logs, logs
    assert "speedups_missing" in logs, logs


# -- alert routing by error_type ---------------------------------------------------------------------


def test_the_example_alertmanager_routes_each_cause_by_error_type():
    """Alertmanager's own routing (amtool) sends each error-cause alert to its cause's
    receiver, whatever its severity; the burn-rate alerts keep their severity routes."""
    from sidecar.tools.slo.rules import ERROR_CAUSES
    from tests.support.tools import require_tool

    amtool = require_tool("amtool")
    config = ROOT / "deploy" / "alertmanager" / "alertmanager.yaml"

    def receiver(*labels: str) -> str:
        done = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={config}", *labels],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    expected = {
        "LLMUpstreamUnreachable": "platform-tickets",
        "LLMStreamsBroken": "model-serving-tickets",
    }
    assert {cause.alert for cause in ERROR_CAUSES} == set(expected)
    for cause in ERROR_CAUSES:
        for error_type in cause.error_types:
            for severity in ("ticket", "page"):
                got = receiver(
                    f"alertname={cause.alert}",
                    f"error_type={error_type}",
                    f"severity={severity}",
                    "model=m",
                )
                assert got == expected[cause.alert], (cause.alert, error_type, severity, got)
    assert (
        receiver("alertname=LLMAvailabilityBurnRate", "severity=page", "slo=availability")
        == "pager"
    )
