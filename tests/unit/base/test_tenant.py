"""The opt-in tenant label: from a configured header, bounded like ``model``, never a
credential, on requests, tokens, TTFT and goodput, and absent everywhere when off."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from sidecar.base.tenant import TenantLabeler, check_tenant_header
from sidecar.config import ConfigError, load_settings
from sidecar.tools.slo import parse_spec
from tests.support.waits import wait_for

ROUTE = "/v1/chat/completions"


# -- the labeler ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    ["Authorization", "proxy-authorization", "Cookie", "X-Api-Key", "api-key", "x-goog-api-key", "X-Auth-Token",
     "X-Session-Id", "X-Client-Secret", "X-Amz-Security-Token", "OpenAI-Key"],
)  # fmt: skip
def test_credential_headers_are_refused(header):
    with pytest.raises(ValueError, match="carries credentials"):
        check_tenant_header(header)


@pytest.mark.parametrize("header", ["X-Tenant", "x-api-key-id", "X-Consumer-Username", "X-Team"])
def test_name_and_key_id_headers_are_accepted(header):
    assert check_tenant_header(header) == header


def test_not_a_header_name_is_refused():
    with pytest.raises(ValueError, match="not an HTTP header name"):
        check_tenant_header("X Tenant")


def test_values_are_bounded_like_models():
    label = TenantLabeler("X-Tenant", max_tenants=2)
    h = lambda v: CIMultiDict({"x-tenant": v})  # noqa: E731 - header names are case-insensitive
    assert label(h("team-a")) == "other"  # not yet earned: no 2xx answer so far
    assert label.settle(h("team-a"), 404) == "other"  # a 4xx never takes a slot
    assert label.settle(h("team-a"), 200) == "team-a"
    assert label.settle(h("team-b"), 200) == "team-b"
    assert label.settle(h("team-c"), 200) == "other"  # the third distinct value
    assert label(h("team-a")) == "team-a"  # a value that passed keeps passing
    assert label(CIMultiDict()) == "unknown"
    assert label(h("  ")) == "unknown"


def test_allowlist_passes_only_listed_tenants():
    label = TenantLabeler("X-Tenant", allowlist=["acme"])
    assert label({"X-Tenant": "acme"}) == "acme"
    assert label({"X-Tenant": "globex"}) == "other"


@pytest.mark.parametrize(
    "value",
    ["sk-proj-abc123", "Bearer abc", "bearer", "eyJhbGciOiJIUzI1NiJ9", "hf_abcdef", "AKIAIOSFODNN7EXAMPLE",
     "a" * 65, "team a", "tëam", "-lead", "a\x00b"],
)  # fmt: skip
def test_credential_like_or_odd_values_become_other(value):
    assert TenantLabeler("X-Tenant")({"X-Tenant": value}) == "other"


# -- configuration ------------------------------------------------------------------------------------


def test_config_refuses_a_credential_header_with_one_line():
    with pytest.raises(ConfigError) as err:
        load_settings(
            {"upstream": "http://127.0.0.1:8000", "tenant_header": "Authorization"}, environ={}
        )
    msg = str(err.value)
    assert (
        msg.startswith("invalid tenant_header (--tenant-header)") and "carries credentials" in msg
    )
    assert "\n" not in msg


def test_config_from_environment_and_off_by_default():
    env = {
        "LLM_SIDECAR_TENANT_HEADER": "X-Tenant",
        "LLM_SIDECAR_TENANT_ALLOWLIST": "a, b",
        "LLM_SIDECAR_MAX_TENANTS": "5",
    }
    s = load_settings({"upstream": "http://127.0.0.1:8000"}, environ=env)
    assert (s.tenant_header, s.tenant_allowlist, s.max_tenants) == ("X-Tenant", ["a", "b"], 5)
    off = load_settings(
        {"upstream": "http://127.0.0.1:8000"}, environ={"LLM_SIDECAR_TENANT_HEADER": ""}
    )
    assert off.tenant_header is None


# -- a live sidecar ---------------------------------------------------------------------------------


def _chunk(text: str) -> bytes:
    return (
        b'data: {"id":"c","model":"m1","choices":[{"index":0,"delta":{"content":"'
        + text.encode()
        + b'"}}]}\n\n'
    )


STREAM = [
    _chunk("a"),
    _chunk("b"),
    b'data: {"id":"c","model":"m1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]


def chat_upstream(received: list):
    async def handler(request: web.Request) -> web.StreamResponse:
        received.append((request.headers.copy(), await request.read()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for data in STREAM:
            await resp.write(data)
            await asyncio.sleep(0.005)
        await resp.write_eof()
        return resp

    return lambda app: app.router.add_post(ROUTE, handler)


async def send(url: str, tenant: str | None) -> bytes:
    headers = {"X-Tenant": tenant} if tenant is not None else {}
    async with aiohttp.ClientSession() as s:
        async with s.post(url + ROUTE, data=b'{"model":"m1","stream":true}', headers=headers) as r:
            assert r.status == 200
            return await r.read()


async def test_tenant_label_on_requests_tokens_ttft_and_goodput(upstream, sidecar_factory):
    received: list = []
    up = await upstream.start(chat_upstream(received))
    s = await sidecar_factory(up.url, tenant_header="X-Tenant", max_tenants=2)
    for tenant in ("team-a", "team-a", "team-b", "team-c", None, "sk-live-SECRET"):
        await send(s.url, tenant)
    await wait_for(lambda: sum(s.sample("llm_requests_total", model="m1", route=ROUTE, code="200", outcome="ok", tenant=t) or 0
                               for t in ("team-a", "team-b", "other", "unknown")) == 6)  # fmt: skip
    ok = dict(model="m1", route=ROUTE, code="200", outcome="ok")
    assert [
        s.sample("llm_requests_total", **ok, tenant=t)
        for t in ("team-a", "team-b", "other", "unknown")
    ] == [2, 1, 2, 1]
    assert (
        s.sample("llm_tokens_total", model="m1", route=ROUTE, type="output", tenant="team-a") == 4
    )
    assert s.sample("llm_tokens_total", model="m1", route=ROUTE, type="input", tenant="other") == 6
    assert s.sample("llm_time_to_first_token_seconds_count", model="m1", tenant="team-b") == 1
    assert s.sample("llm_requests_within_slo_total", model="m1", tenant="team-a") == 2
    # Series that do not answer "who" keep their labels.
    assert s.sample("llm_request_duration_seconds_count", model="m1", outcome="ok") == 6
    assert s.sample("llm_requests_in_flight", model="m1", route=ROUTE) == 0
    # The secret-looking value never became a label value.
    exposition = "\n".join(
        str(sample) for metric in s.registry.collect() for sample in metric.samples
    )
    assert "SECRET" not in exposition and "sk-live" not in exposition
    # Read, never changed: the upstream got the header as the client sent it.
    assert [h.get("X-Tenant") for h, _ in received] == [
        "team-a",
        "team-a",
        "team-b",
        "team-c",
        None,
        "sk-live-SECRET",
    ]


async def test_without_the_option_no_series_has_a_tenant_label(upstream, sidecar_factory):
    received: list = []
    up = await upstream.start(chat_upstream(received))
    s = await sidecar_factory(up.url)
    await send(s.url, "team-a")
    await wait_for(
        lambda: (
            s.sample("llm_requests_total", model="m1", route=ROUTE, code="200", outcome="ok") == 1
        )
    )
    names = {
        name
        for metric in s.registry.collect()
        for sample in metric.samples
        for name in sample.labels
    }
    assert "tenant" not in names
    assert s.sample("llm_tokens_total", model="m1", route=ROUTE, type="output") == 2


# -- SLO grouping ---------------------------------------------------------------------------------------


def spec(grouping, *objectives) -> dict:
    return {"version": 1, "grouping": grouping, "objectives": list(objectives)}


AVAILABILITY = {"name": "availability", "sli": "availability", "target": 99.5}
TTFT = {"name": "ttft", "sli": "ttft", "target": 95, "threshold_seconds": 2.0}


def test_slo_grouping_accepts_tenant_for_slis_whose_series_carry_it():
    parsed = parse_spec(spec(["namespace", "model", "tenant"], AVAILABILITY, TTFT))
    assert parsed.grouping == ("namespace", "model", "tenant")


@pytest.mark.parametrize("sli", ["tpot", "itl", "e2e"])
def test_slo_grouping_by_tenant_refuses_slis_without_the_label(sli):
    threshold = {"tpot": 0.1, "itl": 0.1, "e2e": 60.0}[sli]
    with pytest.raises(
        Exception,
        match=f"grouping by tenant needs an SLI whose series carry it.*{sli} has no tenant",
    ):
        parse_spec(
            spec(
                ["model", "tenant"],
                AVAILABILITY,
                {"name": sli, "sli": sli, "target": 95, "threshold_seconds": threshold},
            )
        )
