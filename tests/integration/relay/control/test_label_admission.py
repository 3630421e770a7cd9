"""Label admission that the upstream cannot game either, over
real sockets: a scripted upstream that lists what each test wants at /v1/models (in several
reads, gzip-compressed, rotating, 1,200 entries long) and, like llama.cpp, answers any model
name with a 200 stream; the sidecar in front; the page read as Prometheus reads it."""

from __future__ import annotations

import asyncio
import gzip
import random

import aiohttp
import orjson
import pytest
from aiohttp import web

from sidecar.relay.control.model_discovery import USER_AGENT
from tests.support.exposition import count_series
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
SERVED = "zz-served-llama-8b"  # sorts after every adapter: alphabetical order would drop it


def vllm_card(name: str, parent: str | None = None) -> dict:
    """One /v1/models entry as vLLM 0.32 writes it (a LoRA adapter has root and parent)."""
    return {
        "id": name, "object": "model", "created": 1764000000, "owned_by": "vllm",
        "root": f"/models/{name}" if parent else name, "parent": parent, "max_model_len": 8192,
        "permission": [{
            "id": f"modelperm-{random.getrandbits(128):032x}", "object": "model_permission",
            "created": 1764000000, "allow_create_engine": False, "allow_sampling": True,
            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
            "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
        }],
    }  # fmt: skip


def listing(names: list[str]) -> bytes:
    return orjson.dumps(
        {
            "object": "list",
            "data": [vllm_card(n, None if i == 0 else names[0]) for i, n in enumerate(names)],
        }
    )


async def chat(request: web.Request) -> web.StreamResponse:
    """Any model name answered 200 with a short stream (llama.cpp and TGI do so); a stream
    held open for ``x-hold`` seconds between its tokens."""
    body = await request.json()
    hold = float(request.headers.get("x-hold", "0"))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i, text in enumerate(("Hel", "lo")):
        if i:
            await asyncio.sleep(hold)
        chunk = {"id": "c", "object": "chat.completion.chunk", "model": body.get("model"),
                 "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}  # fmt: skip
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    done = {"id": "c", "object": "chat.completion.chunk", "model": body.get("model"),
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}  # fmt: skip
    await response.write(b"data: " + orjson.dumps(done) + b"\n\ndata: [DONE]\n\n")
    await response.write_eof()
    return response


async def ask(s: aiohttp.ClientSession, url: str, model: str, **headers: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with s.post(url + CHAT, json=body, headers=headers) as r:
        await r.read()
        return r.status


def model_values(sc) -> set[str]:
    return {
        s.labels["model"]
        for family in sc.registry.collect()
        for s in family.samples
        if "model" in s.labels and s.value
    }


async def page(sc) -> bytes:
    async with aiohttp.ClientSession() as s:
        async with s.get(sc.admin_url + "/metrics") as r:
            return await r.read()


async def listed(sc, name: str) -> None:
    """The background poll has taken a listing that names ``name``."""
    await wait_for(
        lambda: (
            sc.sidecar.metrics.model_label.authoritative
            and sc.sidecar.metrics.model_label.known(name)
        )
    )


async def test_a_listing_that_arrives_in_two_reads_is_the_authority(upstream, sidecar_factory):
    """Finding 1: ``read(n)`` returned the first chunk only, the cut JSON failed to parse and
    the listing was ignored, so a squatting name answered 200 got its own series."""
    body = orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": SERVED,
                    "object": "model",
                    "owned_by": "vllm",
                    "root": SERVED,
                    "parent": None,
                }
            ],
        }
    )
    assert 100 < len(body) < 300

    async def models(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[:60])
        await asyncio.sleep(0.1)
        await response.write(body[60:])
        return response

    up = await upstream.start(
        lambda app: (app.router.add_get("/v1/models", models), app.router.add_post(CHAT, chat))
    )
    sc = await sidecar_factory(up.url, model_refresh_seconds=0.2)
    await listed(sc, SERVED)
    async with aiohttp.ClientSession() as s:
        assert await ask(s, sc.url, "squatter") == 200
        assert await ask(s, sc.url, SERVED) == 200
    await wait_for(
        lambda: sc.sample("llm_label_overflow_total", label="model", reason="not_listed") == 1
    )
    assert model_values(sc) <= {SERVED, "other", "unknown"}


async def test_a_gzip_listing_is_read_and_the_poll_asks_for_identity(upstream, sidecar_factory):
    """Finding 2: the poll sent aiohttp's default ``Accept-Encoding: gzip, deflate`` on a
    session that does not decompress; a gateway that compressed the listing made it
    unreadable. Now it asks for identity, and a gateway that compresses anyway is undone."""
    seen: list[str] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Accept-Encoding", ""))
        assert request.headers.get("User-Agent") == USER_AGENT
        return web.Response(  # compressed whatever was asked, as a misbehaving gateway does
            body=gzip.compress(listing([SERVED, "adapter-a"])),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )

    up = await upstream.start(
        lambda app: (app.router.add_get("/v1/models", models), app.router.add_post(CHAT, chat))
    )
    sc = await sidecar_factory(up.url, model_refresh_seconds=0.2)
    await listed(sc, "adapter-a")
    assert seen and set(seen) == {"identity"}
    async with aiohttp.ClientSession() as s:
        assert await ask(s, sc.url, "squatter") == 200
        assert await ask(s, sc.url, SERVED) == 200
    await wait_for(
        lambda: (
            sc.sample(
                "llm_requests_total",
                model=SERVED,
                route=CHAT,
                code="200",
                outcome="ok",
                error_type="none",
            )
            == 1
        )
    )
    assert sc.sample("llm_label_overflow_total", label="model", reason="not_listed") == 1
    assert model_values(sc) <= {SERVED, "other", "unknown"}


async def test_a_1200_entry_vllm_listing_with_adapters_keeps_the_served_model(
    upstream, sidecar_factory
):
    """Findings 1 and 5: a ~550 KB vLLM listing (the served model first, then 1,199 LoRA
    adapters, written in 64 KB pieces) was cut at the first read; and a listing longer than
    --max-models kept the alphabetically first names, so the served model (listed first,
    sorting last) was filed under ``other``."""
    names = [SERVED] + [f"adapter-{i:04d}" for i in range(1199)]
    body = listing(names)
    assert 500_000 < len(body) < 700_000

    async def models(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)  # chunked, in pieces with pauses between
        for at in range(0, len(body), 64 << 10):
            await response.write(body[at : at + (64 << 10)])
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    up = await upstream.start(
        lambda app: (app.router.add_get("/v1/models", models), app.router.add_post(CHAT, chat))
    )
    sc = await sidecar_factory(up.url, model_refresh_seconds=0.5, max_models=5)
    await listed(sc, SERVED)
    async with aiohttp.ClientSession() as s:
        assert await ask(s, sc.url, SERVED) == 200
        assert await ask(s, sc.url, "adapter-1198") == 200  # listed (the 1,200th), no slot left
        assert await ask(s, sc.url, "squatter") == 200
    await wait_for(
        lambda: (
            sc.sample(
                "llm_requests_total",
                model=SERVED,
                route=CHAT,
                code="200",
                outcome="ok",
                error_type="none",
            )
            == 1
        )
    )
    assert (
        sc.sample("llm_label_overflow_total", label="model", reason="not_listed") == 1
    )  # the squatter only
    # The adapter the server answered took the slot of one never requested; five at most.
    assert model_values(sc) == {SERVED, "adapter-1198", "other"}
    assert len(sc.sidecar.metrics.model_label.values) == 5


async def test_a_rotating_listing_keeps_model_values_and_the_page_bounded(
    upstream, sidecar_factory
):
    """Finding 3: a listing naming ten new models every poll, each requested once: every
    name ever listed stayed as a label value (80 values and 29,480 samples after 8 polls
    with --max-models 10 --max-series 3000). Now values stay within --max-models and the
    page within --max-series."""
    generation = [0]

    async def models(request: web.Request) -> web.Response:
        g = generation[0]
        return web.Response(
            body=listing([f"rot-{g}-{i}" for i in range(10)]), content_type="application/json"
        )

    up = await upstream.start(
        lambda app: (app.router.add_get("/v1/models", models), app.router.add_post(CHAT, chat))
    )
    sc = await sidecar_factory(up.url, model_refresh_seconds=0.05, max_models=10, max_series=3000)
    async with aiohttp.ClientSession() as s:
        for g in range(8):
            generation[0] = g
            await listed(sc, f"rot-{g}-9")
            for i in range(10):
                assert await ask(s, sc.url, f"rot-{g}-{i}") == 200
            await wait_for(lambda: sc.in_flight() == 0)
            values = model_values(sc) - {"other", "unknown"}
            assert len(values) <= 10, (g, sorted(values))
            served = await page(sc)
            assert count_series(served) <= 3000, (g, count_series(served))
    # The names listed before gave their series back, so the live ones have theirs (as
    # many as the budget holds: about 300 samples each).
    live = model_values(sc) - {"other", "unknown"}
    assert all(v.startswith("rot-7-") for v in live) and len(live) >= 5, sorted(live)


async def test_listed_names_cannot_take_the_page_past_the_series_budget(upstream, sidecar_factory):
    """Finding 4: 50 models allowed, a static listing of 50 names, one stream each: listed
    names were never counted, and the page held 22,840 samples at the 12,000 budget. The
    budget here (4,000) is below what 50 models' series take, so it is what binds."""
    names = [f"listed-{i:02d}" for i in range(50)]

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=listing(names), content_type="application/json")

    up = await upstream.start(
        lambda app: (app.router.add_get("/v1/models", models), app.router.add_post(CHAT, chat))
    )
    sc = await sidecar_factory(up.url, model_refresh_seconds=0.2, max_series=4_000)
    await listed(sc, names[-1])
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(ask(s, sc.url, n) for n in names))
    await wait_for(lambda: sc.in_flight() == 0)
    served = await page(sc)
    assert count_series(served) <= 4_000, count_series(served)
    assert b"_created" not in served  # finding 8: about 9 % of the page, read by nothing
    admitted = model_values(sc) - {"other", "unknown"}
    assert 10 <= len(admitted) < 50  # as many as fit, the rest under other, counted
    refused = sc.sample("llm_label_overflow_total", label="model", reason="series_budget")
    assert refused == 50 - len(admitted), (refused, len(admitted))


async def test_a_label_is_never_dropped_while_a_request_holds_it(upstream, sidecar_factory):
    """Finding 6: ``expire()`` looked only at when the label's last request started, so a
    stream longer than the idle time lost its label mid-stream: the in-flight gauge went
    1 -> 0 (series removed) -> -1, and the stream's decode seconds were lost."""
    up = await upstream.start(lambda app: app.router.add_post(CHAT, chat))  # no listing: earned
    sc = await sidecar_factory(up.url, label_idle_seconds=0.2, model_refresh_seconds=0.05)
    gauge = {"model": "earned-a", "route": CHAT}
    async with aiohttp.ClientSession() as s:
        assert await ask(s, sc.url, "earned-a") == 200  # earns the label
        await wait_for(
            lambda: (
                sc.sample(
                    "llm_requests_total",
                    model="earned-a",
                    route=CHAT,
                    code="200",
                    outcome="ok",
                    error_type="none",
                )
                == 1
            )
        )
        long = asyncio.ensure_future(ask(s, sc.url, "earned-a", **{"x-hold": "3"}))
        await wait_for(lambda: sc.sample("llm_requests_in_flight", **gauge) == 1)
        seen = []
        for _ in range(10):  # several refreshes, each past the idle time
            await asyncio.sleep(0.1)
            seen.append(sc.sample("llm_requests_in_flight", **gauge))
        assert await long == 200
    await wait_for(lambda: sc.in_flight() == 0)
    assert seen == [1.0] * 10
    assert sc.sample("llm_requests_in_flight", **gauge) in (0.0, None)  # never -1
    seconds = sc.sample(
        "llm_decode_seconds_by_concurrency_total", model="earned-a", concurrency="1"
    )
    assert seconds is not None and seconds >= 1.0, seconds  # the held stream's decode time is kept
    # Released and idle: now it gives its slot and series back.
    await wait_for(lambda: "earned-a" not in model_values(sc))


async def test_a_tenant_is_never_dropped_while_a_request_holds_it(upstream, sidecar_factory):
    """Finding 6 for tenants: the proxy held only the model label from start to end, so a
    tenant whose idle time passed mid-stream lost its series (its request counter dropped and
    restarted from zero) while its own request still ran."""
    up = await upstream.start(lambda app: app.router.add_post(CHAT, chat))
    sc = await sidecar_factory(
        up.url, tenant_header="X-Tenant", label_idle_seconds=0.2, model_refresh_seconds=0.05
    )
    ok = {
        "model": "m",
        "route": CHAT,
        "code": "200",
        "outcome": "ok",
        "error_type": "none",
        "tenant": "team-a",
    }
    gauge = {"model": "m", "route": CHAT}
    async with aiohttp.ClientSession() as s:
        assert await ask(s, sc.url, "m", **{"X-Tenant": "team-a"}) == 200  # earns the tenant
        await wait_for(lambda: sc.sample("llm_requests_total", **ok) == 1)
        long = asyncio.ensure_future(ask(s, sc.url, "m", **{"X-Tenant": "team-a", "x-hold": "3"}))
        await wait_for(lambda: sc.sample("llm_requests_in_flight", **gauge) == 1)
        counted, in_flight = [], []
        for _ in range(10):  # several refreshes, each past the idle time
            await asyncio.sleep(0.1)
            counted.append(sc.sample("llm_requests_total", **ok))
            in_flight.append(sc.sample("llm_requests_in_flight", **gauge))
        assert "team-a" in sc.sidecar.tenants.bound.values
        assert await long == 200
    await wait_for(lambda: sc.in_flight() == 0)
    assert counted == [1.0] * 10  # the tenant's series stayed while its request ran
    assert in_flight == [1.0] * 10
    assert sc.sample("llm_requests_total", **ok) == 2  # one count, not restarted from zero
    assert sc.sample("llm_requests_in_flight", **gauge) in (0.0, None)  # never -1
    # Released and idle: now it gives its slot and series back.
    await wait_for(lambda: "team-a" not in sc.sidecar.tenants.bound.values)
    await wait_for(lambda: sc.sample("llm_requests_total", **ok) is None)


async def test_a_models_first_stream_does_not_make_every_capacity_band(upstream, sidecar_factory):
    """Finding 8: each model value (``other`` and ``unknown`` too) pre-created 234 lines of
    llm_inter_token_latency_by_concurrency_seconds (9 bands) at its first stream."""
    up = await upstream.start(lambda app: app.router.add_post(CHAT, chat))
    sc = await sidecar_factory(up.url)
    async with aiohttp.ClientSession() as s:
        assert await ask(s, sc.url, "m") == 200
    await wait_for(lambda: sc.in_flight() == 0)
    lines = [
        line
        for line in (await page(sc)).split(b"\n")
        if line.startswith(b"llm_inter_token_latency_by_concurrency_seconds")
    ]
    assert 0 < len(lines) <= 100, len(lines)


async def test_a_listing_longer_than_max_models_keeps_the_served_model_listed_first(
    upstream, sidecar_factory
):
    """Finding 5: ``sorted(listed)[:max_models]`` kept the alphabetically first names: the
    served model listed first plus 60 adapters put every request for it under ``other``."""
    names = [SERVED] + [f"adapter-{i:02d}" for i in range(60)]
    body = orjson.dumps({"object": "list", "data": [{"id": n, "object": "model"} for n in names]})

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    up = await upstream.start(
        lambda app: (app.router.add_get("/v1/models", models), app.router.add_post(CHAT, chat))
    )
    sc = await sidecar_factory(up.url, model_refresh_seconds=0.2, max_models=50)
    await wait_for(lambda: sc.sidecar.metrics.model_label.authoritative)
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            assert await ask(s, sc.url, SERVED) == 200
    await wait_for(
        lambda: (
            sc.sample(
                "llm_requests_total",
                model=SERVED,
                route=CHAT,
                code="200",
                outcome="ok",
                error_type="none",
            )
            == 3
        )
    )
    assert sc.sidecar.metrics.model_label.values == frozenset(names[:50])


def test_a_listed_name_the_server_answers_takes_the_slot_of_one_never_requested():
    """The other half of finding 5, where the listing's order says nothing (a gateway that
    sorts it): the name the server answers for takes a slot from a listed name nobody asked
    for, never from one in use or held by a request."""
    from sidecar.base.labels import ModelLabeler

    labeler = ModelLabeler(max_models=3)
    labeler.vouch(["a-adapter", "b-adapter", "c-adapter", SERVED])
    assert labeler(SERVED) == "other"
    assert labeler.settle("a-adapter", 200) == "a-adapter"  # in use from now
    labeler.hold("b-adapter")  # a request under it in flight
    assert labeler.settle(SERVED, 404) == "other"  # a 4xx proves nothing
    assert labeler.settle(SERVED, 200) == SERVED  # took c-adapter's slot
    assert labeler.values == {"a-adapter", "b-adapter", SERVED}
    assert labeler.settle("d-adapter", 200) == "other"  # not listed at all
    labeler.vouch(["a-adapter", "b-adapter", "c-adapter", SERVED])  # the next refresh keeps them
    assert labeler.values == {"a-adapter", "b-adapter", SERVED}


def test_a_rotating_listing_forgets_at_once_what_does_not_fit_and_never_a_held_value():
    """Finding 3 at the unit level: a name a new listing drops stays only while there is
    room, least recently seen given back first, never one a request holds; and a held value
    is released into its idle time (finding 6)."""
    from sidecar.base.labels import ModelLabeler

    now = [0.0]
    forgotten: list[str] = []
    labeler = ModelLabeler(
        max_models=3, idle_seconds=10, clock=lambda: now[0], on_forget=forgotten.append
    )
    labeler.vouch(["a", "b", "c"])
    for name in ("a", "b", "c"):
        now[0] += 1
        assert labeler.settle(name, 200) == name
    labeler.hold("a")
    labeler.vouch(["x", "y"])  # no room for the old three: all go, but a is held
    assert labeler.values == {"x", "y", "a"} and sorted(forgotten) == ["b", "c"]
    labeler.vouch(["x"])  # y, never requested, had a slot only
    assert labeler.values == {"x", "a"} and sorted(forgotten) == ["b", "c", "y"]
    labeler.hold("x")
    labeler.vouch(["p", "q", "r"])  # a and x (held) stay over the bound until released
    assert labeler.values == {"p", "q", "r", "a", "x"} and len(forgotten) == 3
    labeler.release("a")  # a is held no more: the next refresh gives it back (the oldest)
    assert labeler.expire() == ["a"] and labeler.values == {"p", "q", "r", "x"}
    labeler.release("x")
    assert labeler.expire() == ["x"] and labeler.values == {"p", "q", "r"}
