"""The relay over real sockets: bytes, timing, headers, and every fault path."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from tests.support.samples import per_model
from tests.support.sse import USAGE, chat_chunk, scripted
from tests.support.waits import wait_for

# Each test runs on the production server twice: with the early path (a request sent upstream
# from the read that completed it) and without it (through the handler).
pytestmark = pytest.mark.integration


async def post_stream(
    url: str, body: dict | None = None, headers=None
) -> tuple[bytes, list[float], aiohttp.ClientResponse]:
    """POST and collect the raw body and each read's arrival time."""
    arrivals: list[float] = []
    chunks: list[bytes] = []
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(
            url, json=body or {"model": "m1", "stream": True, "messages": []}, headers=headers
        ) as r:
            async for chunk in r.content.iter_any():
                arrivals.append(time.perf_counter())
                chunks.append(chunk)
            return b"".join(chunks), arrivals, r


STREAM = [
    (0.0, chat_chunk(role=True)),
    (0.20, chat_chunk("Hel")),
    (0.05, chat_chunk("lo")),
    (0.05, chat_chunk(" wor")),
    (0.05, chat_chunk("ld")),
    (0.05, chat_chunk("!", finish="stop")),
    (0.0, USAGE),
    (0.0, b"data: [DONE]\n\n"),
]


async def test_stream_bytes_unchanged_and_figures_match_script(upstream, sidecar_factory):
    sent: list[bytes] = []
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(STREAM, sent=sent))
    )
    sc = await sidecar_factory(up.url)
    request = {
        "model": "m1",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [],
    }
    body, _, resp = await post_stream(sc.url + "/v1/chat/completions", request)
    assert resp.status == 200
    assert body == b"".join(sent)
    assert resp.headers["Content-Type"] == "text/event-stream"

    labels = {"model": "m1", "route": "/v1/chat/completions"}
    await wait_for(lambda: sc.sample("llm_requests_total", code="200", outcome="ok", **labels) == 1)
    # TTFT: the role chunk at 0 s is not a token; the first content chunk comes at 0.20 s.
    ttft = sc.sample("llm_time_to_first_token_seconds_sum", **per_model(labels))
    assert 0.19 <= ttft < 0.35
    assert sc.sample("llm_time_to_first_token_seconds_bucket", le="0.1", **per_model(labels)) == 0
    # Four gaps of ~50 ms between five tokens.
    assert sc.sample("llm_inter_token_latency_seconds_count", **per_model(labels)) == 4
    assert 0.18 <= sc.sample("llm_inter_token_latency_seconds_sum", **per_model(labels)) < 0.3
    assert sc.sample("llm_inter_token_latency_seconds_bucket", le="0.025", **per_model(labels)) == 0
    # TPOT from usage (5 output tokens): (last - first) / 4 ~= 50 ms.
    tpot = sc.sample("llm_time_per_output_token_seconds_sum", **per_model(labels))
    assert 0.045 <= tpot < 0.075
    assert sc.sample("llm_tokens_total", type="output", **labels) == 5
    assert sc.sample("llm_tokens_total", type="input", **labels) == 7
    assert sc.sample("llm_request_tokens_count", type="output", **per_model(labels)) == 1
    e2e = sc.sample("llm_request_duration_seconds_sum", outcome="ok", **per_model(labels))
    assert 0.39 <= e2e < 0.7
    assert sc.in_flight() == 0
    assert sc.sample("llm_requests_within_slo_total", **per_model(labels)) == 1


async def test_a_clients_post_is_the_relays_on_a_new_and_a_kept_alive_connection(
    upstream, sidecar_factory
):
    """A client's POST (aiohttp's, head and body in one write) is answered by the relay from
    the connection's callbacks, on a new connection and on the same one kept alive."""
    sent: list[bytes] = []
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(STREAM, sent=sent))
    )
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        for n in (1, 2):  # a new connection, then the same one kept alive
            async with s.post(
                sc.url + "/v1/chat/completions",
                json={"model": "m1", "stream": True, "messages": []},
            ) as r:
                assert r.status == 200
                assert await r.read() == b"".join(sent[-len(STREAM) :])
            await wait_for(
                lambda n=n: (
                    sc.sample(
                        "llm_requests_total",
                        model="m1",
                        route="/v1/chat/completions",
                        code="200",
                        outcome="ok",
                    )
                    == n
                )
            )
    assert sc.carried == 2


async def test_request_reaches_the_server_as_sent_and_usage_only_when_asked(
    upstream, sidecar_factory
):
    seen: list[dict] = []

    async def handler(request):
        doc = await request.json()
        seen.append(doc)
        inner = scripted(
            STREAM
            if doc.get("stream_options", {}).get("include_usage")
            else [x for x in STREAM if x[1] != USAGE]
        )
        return await inner(request)

    up = await upstream.start(lambda app: app.router.add_post("/v1/chat/completions", handler))
    sc = await sidecar_factory(up.url)
    body, _, _ = await post_stream(
        sc.url + "/v1/chat/completions", {"model": "m1", "stream": True, "messages": []}
    )
    assert seen[0] == {"model": "m1", "stream": True, "messages": []}  # never asked for usage
    assert body == b"".join(data for _, data in STREAM if data != USAGE)
    labels = {"model": "m1", "route": "/v1/chat/completions"}
    await wait_for(lambda: sc.sample("llm_requests_total", code="200", outcome="ok", **labels) == 1)
    assert not sc.sample("llm_tokens_total", type="input", **labels)

    body, _, _ = await post_stream(
        sc.url + "/v1/chat/completions",
        {"model": "m1", "stream": True, "messages": [], "stream_options": {"include_usage": True}},
    )
    assert seen[1]["stream_options"] == {"include_usage": True}
    assert body == b"".join(data for _, data in STREAM)
    await wait_for(lambda: sc.sample("llm_requests_total", code="200", outcome="ok", **labels) == 2)
    assert sc.sample("llm_tokens_total", type="input", **labels) == 7


async def test_chunks_are_relayed_as_they_arrive_not_buffered(upstream, sidecar_factory):
    script = [(0.0, chat_chunk(role=True))] + [(0.15, chat_chunk(f"t{i}")) for i in range(4)]
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(script))
    )
    sc = await sidecar_factory(up.url)
    _, arrivals, _ = await post_stream(sc.url + "/v1/chat/completions")
    # Each scripted chunk is its own read at the client, ~150 ms apart (a buffering proxy
    # would deliver them together at the end).
    assert len(arrivals) >= 5
    gaps = [b - a for a, b in zip(arrivals[-4:], arrivals[-3:], strict=False)]
    assert all(g > 0.1 for g in gaps), gaps


async def test_non_streaming_json_measured_from_usage(upstream, sidecar_factory):
    doc = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 1,
        "model": "m1",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }
    raw = json.dumps(doc).encode()

    async def handler(request):
        await asyncio.sleep(0.1)
        return web.Response(body=raw, content_type="application/json")

    up = await upstream.start(lambda app: app.router.add_post("/v1/chat/completions", handler))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        async with s.post(
            sc.url + "/v1/chat/completions", json={"model": "m1", "messages": []}
        ) as r:
            assert await r.read() == raw
            assert r.headers["Content-Length"] == str(len(raw))
    labels = {"model": "m1", "route": "/v1/chat/completions"}
    await wait_for(lambda: sc.sample("llm_requests_total", code="200", outcome="ok", **labels) == 1)
    assert sc.sample("llm_tokens_total", type="output", **labels) == 3
    assert sc.sample("llm_tokens_total", type="input", **labels) == 11
    assert (
        sc.sample("llm_time_to_first_token_seconds_count", **per_model(labels)) is None
    )  # not streamed
    assert sc.sample("llm_request_duration_seconds_sum", outcome="ok", **per_model(labels)) >= 0.1


async def test_any_method_path_query_and_body_pass_through(upstream, sidecar_factory):
    seen = {}

    async def echo(request: web.Request):
        seen.update(
            method=request.method,
            path_qs=request.raw_path,
            body=await request.read(),
            headers=dict(request.headers),
        )
        return web.Response(
            status=207,
            reason="Multi",
            body=b"echo",
            headers={"X-Up": "1", "Keep-Alive": "timeout=5"},
        )

    up = await upstream.start(lambda app: app.router.add_route("*", "/{tail:.*}", echo))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        async with s.put(
            URL(sc.url + "/some/path?x=1&y=%2F", encoded=True),
            data=b"\x00binary\xff",
            headers={
                "Authorization": "Bearer sk-secret",
                "Connection": "keep-alive, X-Private",
                "X-Private": "hop",
                "X-Forwarded-For": "10.0.0.1",
                "Proxy-Authorization": "Basic abc",
            },
        ) as r:
            assert r.status == 207
            assert r.reason == "Multi"
            assert await r.read() == b"echo"
            assert r.headers["X-Up"] == "1"
            assert "Keep-Alive" not in r.headers
    assert seen["method"] == "PUT"
    assert seen["path_qs"] == "/some/path?x=1&y=%2F"
    assert seen["body"] == b"\x00binary\xff"
    h = seen["headers"]
    assert h["Authorization"] == "Bearer sk-secret"  # end-to-end headers are forwarded
    assert "X-Private" not in h and "Proxy-Authorization" not in h  # hop-by-hop are not
    assert h["X-Forwarded-For"] == "10.0.0.1, 127.0.0.1"
    assert h["X-Forwarded-Proto"] == "http"
    assert h["X-Forwarded-Host"] == f"127.0.0.1:{sc.port}"
    assert "User-Agent" not in h or h["User-Agent"].startswith("Python/")  # the client's own
    await wait_for(
        lambda: sc.sample("llm_non_api_requests_total", method="PUT", code="207", outcome="ok") == 1
    )


async def test_upstream_refused_is_502_json(sidecar_factory, refused_url):
    sc = await sidecar_factory(refused_url)
    async with aiohttp.ClientSession() as s:
        async with s.post(
            sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
        ) as r:
            assert r.status == 502
            doc = await r.json()
    assert doc["error"]["type"] == "upstream_unreachable"
    assert doc["error"]["code"] == 502
    labels = {"model": "m1", "route": "/v1/chat/completions"}
    await wait_for(
        lambda: sc.sample("llm_requests_total", code="502", outcome="error", **labels) == 1
    )
    assert sc.in_flight() == 0


async def test_upstream_slow_headers_is_504_json(upstream, sidecar_factory):
    async def slow(request):
        await asyncio.sleep(60)
        return web.Response(text="late")

    up = await upstream.start(lambda app: app.router.add_post("/v1/completions", slow))
    sc = await sidecar_factory(up.url, read_timeout=0.3)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as s:
        async with s.post(sc.url + "/v1/completions", json={"model": "m1", "prompt": "x"}) as r:
            assert r.status == 504
            assert (await r.json())["error"]["type"] == "upstream_timeout"
    assert time.perf_counter() - t0 < 20, "the 0.3 s read timeout, not the answer at 60 s"
    await wait_for(
        lambda: (
            sc.sample(
                "llm_requests_total",
                model="m1",
                route="/v1/completions",
                code="504",
                outcome="error",
            )
            == 1
        )
    )


async def test_upstream_dying_mid_stream_ends_client_stream_with_error(upstream, sidecar_factory):
    async def dying(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chat_chunk(role=True))
        await resp.write(chat_chunk("a"))
        await asyncio.sleep(0.05)
        await resp.write(chat_chunk("b"))
        await asyncio.sleep(0.05)
        request.transport.abort()  # the server process died
        return resp

    up = await upstream.start(lambda app: app.router.add_post("/v1/chat/completions", dying))
    sc = await sidecar_factory(up.url)
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with aiohttp.ClientSession() as s:
            async with s.post(
                sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
            ) as r:
                async with asyncio.timeout(5):  # must not hang
                    async for chunk in r.content.iter_any():
                        received += chunk
    assert received.endswith(chat_chunk("b"))  # everything relayed before the death arrived
    labels = {"model": "m1", "route": "/v1/chat/completions"}
    await wait_for(
        lambda: sc.sample("llm_requests_total", code="200", outcome="error", **labels) == 1
    )
    assert (
        sc.sample("llm_time_to_first_token_seconds_count", **per_model(labels)) == 1
    )  # partial figures kept


async def test_upstream_stalling_past_idle_timeout_ends_stream(upstream, sidecar_factory):
    script = [(0.0, chat_chunk(role=True)), (0.0, chat_chunk("a")), (60.0, chat_chunk("late"))]
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(script))
    )
    sc = await sidecar_factory(up.url, read_timeout=0.4)
    t0 = time.perf_counter()
    with pytest.raises(aiohttp.ClientPayloadError):
        async with aiohttp.ClientSession() as s:
            async with s.post(
                sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
            ) as r:
                await r.read()
    assert time.perf_counter() - t0 < 20, (
        "cut by the 0.4 s read timeout, not by the late chunk (60 s)"
    )
    await wait_for(
        lambda: (
            sc.sample(
                "llm_requests_total",
                model="m1",
                route="/v1/chat/completions",
                code="200",
                outcome="error",
            )
            == 1
        )
    )


async def test_client_disconnect_cancels_upstream_within_a_second(upstream, sidecar_factory):
    state = {"cancelled_at": None}

    async def endless(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chat_chunk(role=True))
        try:
            for i in range(10_000):  # 500 s
                await resp.write(chat_chunk(f"t{i}"))
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.CancelledError):
            state["cancelled_at"] = time.perf_counter()
            raise
        return resp

    up = await upstream.start(lambda app: app.router.add_post("/v1/chat/completions", endless))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        async with s.post(
            sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True}
        ) as r:
            n = 0
            async for _ in r.content.iter_any():
                n += 1
                if n >= 5:
                    break
            closed_at = time.perf_counter()
            r.close()
    await wait_for(lambda: state["cancelled_at"] is not None, timeout=30)
    # Typically within milliseconds; the margin is for a loaded machine, and still far short of
    # the stream's own end.
    assert state["cancelled_at"] - closed_at < 20
    labels = {"model": "m1", "route": "/v1/chat/completions"}
    await wait_for(
        lambda: sc.sample("llm_requests_total", code="200", outcome="cancelled", **labels) == 1
    )
    assert sc.sample("llm_time_to_first_token_seconds_count", **per_model(labels)) == 1
    assert sc.sample("llm_inter_token_latency_seconds_count", **per_model(labels)) >= 3
    assert sc.in_flight() == 0


async def test_client_disconnect_during_prefill_is_cancelled(upstream, sidecar_factory):
    """No bytes yet: only handler cancellation can notice the client left."""
    state = {"cancelled": False, "prefilling": False}

    async def slow_prefill(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        state["prefilling"] = True
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return resp

    app_routes = lambda app: app.router.add_post("/v1/chat/completions", slow_prefill)  # noqa: E731
    up = await upstream.start(app_routes)
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        task = asyncio.create_task(
            s.post(sc.url + "/v1/chat/completions", json={"model": "m1", "stream": True})
        )
        resp = await task
        await wait_for(lambda: state["prefilling"])
        closed_at = time.perf_counter()
        resp.close()
    await wait_for(lambda: state["cancelled"])  # the server stops generating
    assert time.perf_counter() - closed_at < 20, (
        "cancelled when the client left, not after the 60 s prefill"
    )
    labels = {"model": "m1", "route": "/v1/chat/completions"}
    await wait_for(
        lambda: sc.sample("llm_requests_total", code="200", outcome="cancelled", **labels) == 1
    )
    assert sc.in_flight() == 0


async def test_malformed_stream_passes_through_and_counts_parse_errors(upstream, sidecar_factory):
    junk = [
        (0.0, chat_chunk(role=True)),
        (0.0, b"data: {not json}\n\n"),
        (0.0, b"data: \xff\xfe garbage\n\n"),
        (0.0, chat_chunk("ok")),
        (0.0, b"data: [1, 2]\n\n"),
        (0.0, b"data: [DONE]\n\n"),
    ]
    sent: list[bytes] = []
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(junk, sent=sent))
    )
    sc = await sidecar_factory(up.url)
    body, _, _ = await post_stream(sc.url + "/v1/chat/completions")
    assert body == b"".join(sent)
    await wait_for(
        lambda: sc.sample("llm_stream_parse_errors_total", route="/v1/chat/completions") == 3
    )
    assert (
        sc.sample("llm_tokens_total", model="m1", route="/v1/chat/completions", type="output") == 1
    )


async def test_error_inside_stream_counts_as_error(upstream, sidecar_factory):
    script = [
        (0.0, chat_chunk(role=True)),
        (
            0.0,
            b'data: {"error":{"object":"error","message":"overloaded","type":"InternalServerError","param":null,"code":500}}\n\n',
        ),
        (0.0, b"data: [DONE]\n\n"),
    ]
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/chat/completions", scripted(script))
    )
    sc = await sidecar_factory(up.url)
    await post_stream(sc.url + "/v1/chat/completions")
    await wait_for(
        lambda: (
            sc.sample(
                "llm_requests_total",
                model="m1",
                route="/v1/chat/completions",
                code="200",
                outcome="error",
            )
            == 1
        )
    )


async def test_model_labels_are_bounded(upstream, sidecar_factory):
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/completions", scripted([(0, b"data: [DONE]\n\n")]))
    )
    sc = await sidecar_factory(up.url, max_models=2)
    for name in ["a", "b", "c", "d", "a"]:
        await post_stream(
            sc.url + "/v1/completions", {"model": name, "prompt": "x", "stream": True}
        )
    route = "/v1/completions"
    await wait_for(
        lambda: (
            sc.sample("llm_requests_total", model="other", route=route, code="200", outcome="ok")
            == 2
        )
    )
    assert sc.sample("llm_requests_total", model="a", route=route, code="200", outcome="ok") == 2
    assert sc.sample("llm_requests_total", model="b", route=route, code="200", outcome="ok") == 1
    assert sc.sample("llm_requests_total", model="c", route=route, code="200", outcome="ok") is None


async def test_allowlist(upstream, sidecar_factory):
    up = await upstream.start(
        lambda app: app.router.add_post("/v1/completions", scripted([(0, b"data: [DONE]\n\n")]))
    )
    sc = await sidecar_factory(up.url, model_allowlist=["good"])
    for name in ["good", "evil" * 100]:
        await post_stream(
            sc.url + "/v1/completions", {"model": name, "prompt": "x", "stream": True}
        )
    route = "/v1/completions"
    await wait_for(
        lambda: (
            sc.sample("llm_requests_total", model="other", route=route, code="200", outcome="ok")
            == 1
        )
    )
    assert sc.sample("llm_requests_total", model="good", route=route, code="200", outcome="ok") == 1


async def test_readiness_follows_upstream_health(upstream, sidecar_factory):
    healthy = {"ok": False}

    async def health(request):
        return web.Response(status=200 if healthy["ok"] else 503)

    up = await upstream.start(lambda app: app.router.add_get("/health", health))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        async with s.get(sc.admin_url + "/healthz") as r:
            assert r.status == 200
        async with s.get(sc.admin_url + "/readyz") as r:
            assert r.status == 503
        healthy["ok"] = True
        async with s.get(sc.admin_url + "/readyz") as r:
            assert r.status == 200
        async with s.get(sc.admin_url + "/metrics") as r:
            text = await r.text()
    assert "# TYPE llm_requests_total counter" in text
    assert "llm_time_to_first_token_seconds" in text


async def test_readiness_unreachable_upstream(sidecar_factory, refused_url):
    sc = await sidecar_factory(refused_url)
    async with aiohttp.ClientSession() as s:
        async with s.get(sc.admin_url + "/readyz") as r:
            assert r.status == 503
            assert "unreachable" in (await r.json())["reason"]
