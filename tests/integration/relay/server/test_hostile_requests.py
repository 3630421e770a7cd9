"""Hostile requests over real sockets: label cardinality, oversized bodies and headers, request
smuggling, hop-by-hop headers, the admin port's separation, and secrets in every output; and
a whole request head's budget on both ports and the admin port's connection cap.

Raw requests go through plain sockets (an HTTP client library would refuse to send most of
them), and a raw upstream records every byte it receives, so "never forwarded" means the
upstream saw no connection at all.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import string

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from sidecar.base.routes import ROUTES
from tests.support.census import quiet_census, settles_to, tcp_sockets
from tests.support.raw import RawUpstream, raw_exchange, status_and_json
from tests.support.rig import CHAT
from tests.support.sse import chat_chunk
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


# -- label cardinality --------------------------------------------------------------------------


def _hostile_models(rng: random.Random) -> list:
    out: list = []
    for i in range(200):
        n = rng.choice([1, 8, 64, 300, 5000])
        out.append("".join(rng.choice(string.printable) for _ in range(n)) + str(i))
    out += [
        "x" * 1_000_000,
        'quo"te\\back\nnewline',
        "日本語🚀",
        "",
        12,
        3.5,
        None,
        True,
        ["a"],
        {"a": 1},
    ]
    return out


async def test_model_and_route_labels_stay_bounded(rig_factory):
    rig = await rig_factory(max_models=5)
    rng = random.Random(8)
    models = _hostile_models(rng)
    paths = [CHAT] * len(models)
    # Route labels come from a fixed table: random paths, and models named in a Triton path.
    paths += [
        "/" + "".join(rng.choice(string.ascii_letters + "/%.") for _ in range(rng.randint(1, 40)))
        for _ in range(100)
    ]
    paths += [f"/v2/models/{rng.getrandbits(64):x}/generate_stream" for _ in range(50)]
    models += ["m"] * 150
    sem = asyncio.Semaphore(16)

    async def one(session: aiohttp.ClientSession, path: str, model) -> None:
        async with sem:
            async with session.post(
                rig.url + path,
                json={"model": model, "messages": [{"role": "user", "content": "x"}]},
            ) as r:
                await r.read()

    def finished() -> float:  # API requests and the rest (non-API paths), each counted once
        return sum(
            s.value
            for m in rig.registry.collect()
            if m.name in ("llm_requests", "llm_non_api_requests")
            for s in m.samples
            if s.name in ("llm_requests_total", "llm_non_api_requests_total")
        )

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s, p, m) for p, m in zip(paths, models, strict=True)))
        await wait_for(lambda: finished() == len(paths))
        async with s.get(f"http://127.0.0.1:{rig.admin_port}/metrics") as r:
            text = await r.text()

    families = list(text_string_to_metric_families(text))  # the exposition still parses
    model_values = {s.labels["model"] for f in families for s in f.samples if "model" in s.labels}
    route_values = {s.labels["route"] for f in families for s in f.samples if "route" in s.labels}
    assert len(model_values) <= 5 + 2, model_values  # max_models, plus "other" and "unknown"
    assert {"other", "unknown"} <= model_values
    assert route_values <= set(ROUTES) | {"other"}, route_values
    requests = [
        s
        for f in families
        if f.name == "llm_requests"
        for s in f.samples
        if s.name == "llm_requests_total"
    ]
    non_api = [
        s
        for f in families
        if f.name == "llm_non_api_requests"
        for s in f.samples
        if s.name == "llm_non_api_requests_total"
    ]
    assert sum(s.value for s in requests) + sum(s.value for s in non_api) == len(paths)
    series = sum(len(f.samples) for f in families if f.name.startswith("llm_"))
    # Bounded by labels, not by traffic: 7 models x 3 routes x a few codes (10 request series
    # and about 520 llm_* samples in all here; the 200 models unbounded make about 10 000).
    assert len(requests) <= 7 * 3 * 3 and series < 1000, (len(requests), series)


# -- oversized bodies: 413 -------------------------------------------------------------------------

LIMIT = 64 << 10


async def test_oversized_bodies_get_413_and_never_reach_the_upstream(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url, max_request_body_bytes=LIMIT)
    big = b'{"model":"m","prompt":"' + b"a" * LIMIT + b'"}'
    labels = {"model": "unknown", "route": "/v1/completions"}

    # A declared Content-Length over the limit: refused before the upstream is asked.
    async with aiohttp.ClientSession() as s:
        async with s.post(
            rig.url + "/v1/completions", data=big, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 413
            doc = await r.json()
    assert doc["error"]["type"] == "request_too_large" and doc["error"]["code"] == 413

    # Expect: 100-continue: refused at once, so the client never sends the body.
    raw = await raw_exchange(
        rig.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"
        % len(big),
    )
    assert not raw.startswith(b"HTTP/1.1 100") and status_and_json(raw)[0] == 413

    # Chunked (no length up front): cut off and refused as soon as it passes the limit.
    async def chunks():
        for _ in range(4 * LIMIT // 4096):
            yield b"b" * 4096

    async with aiohttp.ClientSession() as s:
        async with s.post(rig.url + "/v1/completions", data=chunks()) as r:
            assert r.status == 413
            assert (await r.json())["error"]["type"] == "request_too_large"
    # The upstream never received a complete request (at most a cut-off chunked body).
    assert all(not RawUpstream._complete(req) for req in up.requests), up.requests
    await wait_for(
        lambda: rig.sample("llm_requests_total", code="413", outcome="ok", **labels) == 3
    )

    # Just under the limit: relayed whole.
    small = b"c" * (LIMIT - 10)
    async with aiohttp.ClientSession() as s:
        async with s.post(rig.url + "/upload", data=small) as r:
            assert r.status == 200 and await r.read() == b"ok"
    assert up.requests[-1].endswith(b"\r\n\r\n" + small)


async def read_one_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
    return head + await reader.readexactly(length)


async def test_stalled_request_bodies_get_408(rig_factory, raw_upstream):
    """A body that stops arriving: read whole (a known route's JSON) or streamed (chunked):
    408. One broken mid-way (a bad chunk after the head was accepted and carried) is the
    client's error at once: 400, as nginx answers a bad chunk."""
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url, client_body_timeout=0.5)  # CLIENT_BODY_TIMEOUT is 60 s
    cases = [
        [b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model":'],
        [
            b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{"m\r\n'
        ],
        [
            b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
            b"-2\r\nhi\r\n0\r\n\r\n" + SMUGGLED,
        ],
    ]
    for pieces in cases:
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
        t0 = asyncio.get_running_loop().time()
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.1)
        raw = await asyncio.wait_for(read_one_response(reader), 5)
        writer.close()
        status, doc, _ = status_and_json(raw)
        want = (400, "bad_request") if b"-2\r\n" in pieces[-1] else (408, "request_timeout")
        assert (status, doc["error"]["type"]) == want, pieces
        assert asyncio.get_running_loop().time() - t0 < 2.0
    # The upstream never received a complete request, and never the smuggled one.
    assert all(not RawUpstream._complete(req) and b"/admin" not in req for req in up.requests), (
        up.requests
    )
    await wait_for(
        lambda: (
            rig.sample("llm_requests_total", model="unknown", route=CHAT, code="408", outcome="ok")
            == 2
        )
    )
    assert rig.sample("llm_non_api_requests_total", method="POST", code="400", outcome="ok") == 1


# -- header floods: 431 / 414 ------------------------------------------------------------------------


async def test_header_floods_get_431_and_long_request_lines_414(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(
        upstream=up.url,
        max_request_headers=40,
        max_header_field_bytes=4096,
        max_request_line_bytes=2048,
        max_request_head_bytes=128 << 10,
    )
    before = await quiet_census()
    cases = {
        "too many headers": (
            b"GET /x HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-F%d: v\r\n" % i for i in range(60))
            + b"\r\n",
            431,
            "too_many_headers",
        ),
        "one huge header": (
            b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 5000 + b"\r\n\r\n",
            431,
            "header_too_large",
        ),
        "huge header name": (
            b"GET /x HTTP/1.1\r\nHost: x\r\n" + b"N" * 5000 + b": v\r\n\r\n",
            431,
            "header_too_large",
        ),
        "huge cookie": (
            b"GET /x HTTP/1.1\r\nHost: x\r\nCookie: " + b"c=1; " * 2000 + b"\r\n\r\n",
            431,
            "header_too_large",
        ),
        "long request line": (
            b"GET /" + b"p" * 3000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            414,
            "request_line_too_long",
        ),
        "long query": (
            b"GET /x?" + b"q=1&" * 1000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            414,
            "request_line_too_long",
        ),
    }
    for name, (request, status, kind) in cases.items():
        raw = await raw_exchange(rig.port, request)
        got, doc, head = status_and_json(raw)
        assert (got, doc["error"]["type"]) == (status, kind), name
        assert b"content-type: application/json" in head.lower(), name
    # Within the limits: relayed.
    ok = (
        b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 3000) for i in range(30))
        + b"\r\n"
    )
    assert (await raw_exchange(rig.port, ok)).endswith(b"\r\n\r\nok")
    assert len(up.requests) == 1  # only the request within the limits reached the upstream
    await settles_to(before)


# -- request smuggling -----------------------------------------------------------------------------

SMUGGLED = b"GET /admin HTTP/1.1\r\nHost: x\r\n\r\n"
_H = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"

SMUGGLING = {
    "CL.TE": _H + b"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "TE.CL": _H
    + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
    "duplicate Content-Length, same value": _H
    + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nhi"
    + SMUGGLED,
    "duplicate Content-Length, conflicting": _H
    + b"Content-Length: 2\r\nContent-Length: 40\r\n\r\nhi"
    + SMUGGLED,
    "Content-Length list": _H + b"Content-Length: 2, 40\r\n\r\nhi" + SMUGGLED,
    "Content-Length sign": _H + b"Content-Length: +2\r\n\r\nhi" + SMUGGLED,
    "Content-Length hex": _H + b"Content-Length: 0x2\r\n\r\nhi" + SMUGGLED,
    "space before colon": _H + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "xchunked": _H + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "chunked not last": _H + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "duplicate Transfer-Encoding": _H
    + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n"
    + SMUGGLED,
    "obs-fold Transfer-Encoding": _H
    + b"Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"
    + SMUGGLED,
    "vertical tab": _H + b"Transfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "NUL in a value": _H + b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n" + SMUGGLED,
    "bare LF line ends": b"POST /v1/completions HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n0\n\n"
    + SMUGGLED,
    "LF-only chunk extension": _H
    + b"Transfer-Encoding: chunked\r\n\r\n2;x\nhi\r\n0\r\n\r\n"
    + SMUGGLED,
    "bad chunk size": _H + b"Transfer-Encoding: chunked\r\n\r\n-2\r\nhi\r\n0\r\n\r\n" + SMUGGLED,
    "HTTP/1.1 without Host": b"POST /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    + SMUGGLED,
    # Parsed fine by aiohttp, refused by the proxy itself (RFC 9112 section 6.1).
    "Transfer-Encoding in HTTP/1.0": b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    + SMUGGLED,
    "identity, chunked": _H + b"Transfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "gzip, chunked": _H + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
}


async def test_request_smuggling_is_refused_and_never_forwarded(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url)
    before = await quiet_census()
    for name, request in SMUGGLING.items():
        raw = await raw_exchange(rig.port, request)
        status, doc, _ = status_and_json(raw)
        want = 501 if name in ("identity, chunked", "gzip, chunked") else 400
        assert status == want and doc["error"]["code"] == want, (name, raw)
        assert len(re.findall(rb"HTTP/1\.[01] \d{3} ", raw)) == 1, (
            name
        )  # one answer, then closed: the tail is never parsed
        assert up.requests == [], (name, up.requests)  # nothing reached the upstream
    await settles_to(before)


async def test_accepted_framing_variants_are_reframed_not_relayed(rig_factory, raw_upstream):
    """Variants aiohttp accepts (tab as whitespace, upper case) are decoded and the upstream
    gets one request framed by the sidecar: the client's framing bytes never pass through."""
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url)
    for te in (b"Transfer-Encoding:\tchunked", b"TRANSFER-ENCODING: CHUNKED"):
        raw = await raw_exchange(
            rig.port,
            b"POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + te
            + b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        )
        assert raw.endswith(b"ok")
        sent = up.requests[-1]
        assert sent.count(b"POST /x HTTP/1.1") == 1 and b"CHUNKED" not in sent and b"\t" not in sent
        assert sent.endswith(b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    # Absolute-form: only its path and query are used; the named host is never contacted.
    raw = await raw_exchange(
        rig.port,
        b"GET http://evil.example/x?y=%2F HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    assert raw.endswith(b"ok") and up.requests[-1].startswith(
        b"GET /x?y=%2F HTTP/1.1\r\nHost: 127.0.0.1:"
    )


# -- hop-by-hop headers, both directions -------------------------------------------------------------


async def test_hop_by_hop_headers_dropped_both_ways(rig_factory, raw_upstream):
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
        b"Connection: close, X-Hop-Resp\r\nX-Hop-Resp: secret\r\nKeep-Alive: timeout=5\r\n"
        b"Proxy-Authenticate: Basic\r\nProxy-Connection: keep-alive\r\nTrailer: X-T\r\nUpgrade: h2c\r\n"
        b"X-End-To-End: yes\r\n\r\nok"
    )
    up = await raw_upstream(response=response)
    rig = await rig_factory(upstream=up.url)
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Connection: keep-alive, X-Hop-Req\r\nConnection: X-Hop-Req2\r\nX-Hop-Req: 1\r\nX-Hop-Req2: 1\r\n"
        b"Keep-Alive: timeout=5\r\nTE: trailers\r\nTrailer: X-T\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\n"
        b"Proxy-Authorization: Basic YQ==\r\nExpect: 100-continue\r\nX-End-To-End: yes\r\n\r\nhi"
    )
    raw = await raw_exchange(
        rig.port, request + b"GET /end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    sent = up.requests[0].lower()
    for name in (
        b"x-hop-req",
        b"keep-alive",
        b"te:",
        b"trailer",
        b"upgrade",
        b"proxy-connection",
        b"proxy-authorization",
        b"expect",
    ):
        assert name not in sent, (name, sent)
    assert (
        b"\r\nx-end-to-end: yes\r\n" in sent
        and sent.count(b"\r\nhost:") == 1
        and sent.count(b"content-length") == 1
    )
    first = raw.split(b"\r\n\r\n", 1)[0].lower()
    assert first.startswith(b"http/1.1 100 continue")  # aiohttp's own, for the Expect it consumed
    head = raw.split(b"\r\n\r\n")[1].lower()
    assert b"x-end-to-end: yes" in head
    for name in (
        b"x-hop-resp",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-connection",
        b"trailer",
        b"upgrade",
    ):
        assert name not in head, (name, head)


# -- the admin port --------------------------------------------------------------------------------------


async def test_admin_port_is_bound_separately(upstream, serve_process):
    async def upstream_metrics(request: web.Request) -> web.Response:
        return web.Response(text="upstream's own metrics")

    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        if not request.headers.get("User-Agent", "").startswith(
            "llm-sidecar"
        ):  # not its own probes
            seen.append(request.path)
        return web.Response(text="upstream")

    def routes(app: web.Application) -> None:
        app.router.add_get("/metrics", upstream_metrics)
        app.router.add_route("*", "/{tail:.*}", anything)

    up = await upstream.start(routes)
    sc = serve_process(up.url)
    await sc.wait_alive()
    listening = sorted(
        (local, remote) for state, local, remote in tcp_sockets(sc.proc.pid) if state == "LISTEN"
    )
    assert [p for p, _ in listening] == sorted([sc.port, sc.admin_port])
    # Bound to the loopback address given, not to every interface.
    for table in ("tcp", "tcp6"):
        for line in open(f"/proc/{sc.proc.pid}/net/{table}").read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) in (sc.port, sc.admin_port):
                assert local.startswith("0100007F:"), local
    async with aiohttp.ClientSession() as s:
        async with s.get(sc.url + "/metrics") as r:  # the proxy port is a pure pass-through
            assert await r.text() == "upstream's own metrics"
        async with s.get(sc.admin_url + "/metrics") as r:
            assert "llm_requests_total" in await r.text()
        for method, path in (("POST", CHAT), ("GET", "/v1/models"), ("GET", "/health")):
            async with s.request(method, sc.admin_url + path, json={}) as r:
                assert r.status in (404, 405), path  # the admin port relays nothing
    assert seen == []


# -- secrets in every output --------------------------------------------------------------------------------

MARKERS = {
    "authorization": "AUTHZ-7c1e",
    "api-key": "APIKEY-5d2a",
    "x-api-key": "XAPIKEY-9b0f",
    "cookie": "COOKIE-3e8c",
    "query": "QUERY-1f6d",
    "prompt": "PROMPT-8a4b",
    "completion": "COMPLETION-2c9e",
    "json completion": "WHOLEREPLY-6b1d",
    "upstream error body": "ERRBODY-4f7a",
    "set-cookie": "SETCOOKIE-0d3b",
    "huge header": "HUGEAUTH-7e2c",
    "smuggled request": "SMUGGLE-5a9d",
    "oversized body": "BIGBODY-3c1e",
    "path": "PATHSECRET-8d4f",
}


async def test_no_secret_reaches_logs_spans_or_metrics(upstream, serve_process):
    """Marked secrets in every place a client or upstream can put them, through a real
    sidecar with tracing and OTel metrics on (console exporters print them to stdout) and
    debug logging; then every output is searched for every marker."""
    m = MARKERS

    async def chat(request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        if not doc.get("stream"):
            return web.json_response(
                {
                    "id": "c2",
                    "object": "chat.completion",
                    "model": "m1",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": m["json completion"]},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
                },
                headers={"Set-Cookie": f"sid={m['set-cookie']}"},
            )
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Set-Cookie": f"sid={m['set-cookie']}"}
        )
        await resp.prepare(request)
        for piece in ("Hi ", m["completion"], "!"):
            await resp.write(chat_chunk(piece, id="c1", created=None, logprobs=False, spaced=True))
        await resp.write(
            b'data: {"id":"c1","model":"m1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}\n\n'
        )
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def failing(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {"error": {"message": f"cannot process {body.decode()} {m['upstream error body']}"}},
            status=500,
        )

    def routes(app: web.Application) -> None:
        app.router.add_post(CHAT, chat)
        app.router.add_post("/v1/completions", failing)
        app.router.add_route("*", "/{tail:.*}", failing)

    up = await upstream.start(routes)
    env = {
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "console",
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "LLM_SIDECAR_OTEL_METRICS": "true",
        "OTEL_SERVICE_NAME": "secrets-test",
    }
    sc = serve_process(up.url, "--log-level", "debug", "--max-request-body-bytes", "4096", env=env)
    await sc.wait_alive()
    headers = {
        "Authorization": f"Bearer sk-{m['authorization']}",
        "api-key": m["api-key"],
        "x-api-key": m["x-api-key"],
        "Cookie": f"session={m['cookie']}",
    }
    prompt = {"role": "user", "content": f"my password is {m['prompt']}"}
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{sc.url}{CHAT}?key={m['query']}",
            json={"model": "m1", "stream": True, "messages": [prompt]},
            headers=headers,
        ) as r:
            assert m["completion"].encode() in await r.read()
        async with s.post(
            f"{sc.url}{CHAT}?key={m['query']}",
            json={"model": "m1", "messages": [prompt]},
            headers=headers,
        ) as r:
            assert m["json completion"] in await r.text()
        async with s.post(
            f"{sc.url}/v1/completions?key={m['query']}",
            json={"model": "m1", "prompt": m["prompt"]},
            headers=headers,
        ) as r:
            assert r.status == 500 and m["upstream error body"] in await r.text()
        async with s.get(f"{sc.url}/files/{m['path']}?key={m['query']}", headers=headers) as r:
            assert r.status == 500
        async with s.post(
            f"{sc.url}{CHAT}", data=(m["oversized body"] * 1000).encode(), headers=headers
        ) as r:
            assert r.status == 413
    # Refused by the HTTP parser: aiohttp alone would log (and echo) the first bytes of these.
    huge = await raw_exchange(
        sc.port,
        b"GET /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s%s\r\n\r\n"
        % (m["huge header"].encode(), b"A" * 9000),
    )
    assert re.match(rb"HTTP/1\.[01] 431 ", huge) and m["huge header"].encode() not in huge
    smuggle = await raw_exchange(
        sc.port,
        b"POST /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        % m["smuggled request"].encode(),
    )
    assert (
        re.match(rb"HTTP/1\.[01] 400 ", smuggle) and m["smuggled request"].encode() not in smuggle
    )

    metrics = await sc.metrics()
    await asyncio.sleep(0.6)  # an OTel metrics export interval
    sc.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(sc.proc.wait, 15) == 0
    out, err = sc.stop()

    # The outputs are real, so finding nothing means something.
    assert (
        '"name": "chat m1"' in out and "gen_ai.client.operation.duration" in out
    )  # a span, OTel metrics
    assert out.count('"event": "request"') == 5 and '"event": "request_refused"' in out
    assert 'llm_requests_total{code="413"' in metrics
    for where, text in (
        ("stdout (logs, spans, OTel metrics)", out),
        ("stderr", err),
        ("/metrics", metrics),
    ):
        for what, marker in m.items():
            assert marker not in text, f"{what} marker {marker} found in {where}"


# -- a whole head's budget, the admin port's connection cap ---------------------------------------
#
# Finding 1: a whole request head has a budget on both ports: a client that sends many fields,
# each within the per-field limit, and never ends the head gets 431 with the JSON error body as
# soon as it passes the budget, instead of pinning up to ~1 MiB per connection until the head
# timeout; request bodies do not count. Finding 5: the admin port caps its connections.

# 126 fields of 8,000 B, as the probe sent: each within the 8,190 B field limit, never ended.
UNENDED = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(
    b"X-F%d: %s\r\n" % (i, b"v" * 7990) for i in range(126)
)


async def test_an_unended_oversized_head_gets_431_on_both_ports(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url)
    for port in (rig.port, rig.admin_port):
        # The head timeout is 60 s: a reply within 5 s can only come from the budget.
        raw = await raw_exchange(port, UNENDED, wait=5.0)
        assert raw, f"port {port}: nothing answered an unended 1 MiB head"
        status, doc, head = status_and_json(raw)
        assert (status, doc["error"]["type"]) == (431, "request_head_too_large"), port
        assert b"content-type: application/json" in head.lower()
    assert up.requests == []


async def test_heads_within_the_budget_and_large_bodies_are_relayed(rig_factory, raw_upstream):
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url, max_request_head_bytes=48 * 1024)
    ok = (
        b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 1000) for i in range(40))
        + b"\r\n"
    )
    assert (await raw_exchange(rig.port, ok)).endswith(b"\r\n\r\nok")
    over = (
        b"GET /x HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 1000) for i in range(60))
        + b"\r\n"
    )
    assert status_and_json(await raw_exchange(rig.port, over))[0] == 431
    # A body far larger than the head budget, then a second request on the same connection:
    # neither the body nor the next head is refused.
    body = b'{"model":"m","pad":"' + b"p" * 300_000 + b'"}'
    two = (
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
        % (len(body), body)
        + b"GET /y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    raw = await raw_exchange(rig.port, two, wait=5.0)
    assert raw.count(b"HTTP/1.1 200") == 2 and b" 431 " not in raw
    assert len(up.requests) == 3


async def test_the_admin_port_caps_its_connections_and_answers_503_past_the_cap(
    rig_factory, raw_upstream
):
    """1,100 idle admin connections would use up the open files without the admin cap."""
    up = await raw_upstream()
    rig = await rig_factory(upstream=up.url, max_admin_connections=5)
    idle = [await asyncio.open_connection("127.0.0.1", rig.admin_port) for _ in range(5)]
    raw = await raw_exchange(rig.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", wait=5.0)
    status, doc, head = status_and_json(raw)
    assert (status, doc["error"]["type"]) == (503, "too_many_connections")
    assert b"retry-after: 1" in head.lower()
    # The proxy port is not affected, and the admin port answers again once the idle ones go.
    assert (
        await raw_exchange(rig.port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    ).endswith(b"ok")
    for _, writer in idle:
        writer.close()

    async def healthz_ok() -> bool:
        return (
            await raw_exchange(
                rig.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
        ).startswith(b"HTTP/1.1 200")

    await wait_for(healthz_ok)
