"""The SLO rules reference only metrics, labels and label values a running sidecar exports.

A real sidecar (proxy and admin apps on sockets) relays a streamed, a plain and a failed
request from a scripted upstream; its /metrics is the reference. Every selector in every rule
expression and in the alert templates' queries is checked against it: metric names, matcher
label names, `le` bucket values exactly as written, outcome values, and `by (...)` labels.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from functools import partial

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from sidecar.base.outcomes import Outcome
from sidecar.tools.slo import aggregates, conventions as c, generate, parse_spec, render_rules
from tests.support.paths import ROOT
from tests.support.sse import chat_chunk
from tests.support.waits import wait_for

RULE_FILES = sorted((ROOT / "deploy" / "prometheus").glob("*.yaml"))

# Every SLI kind (the default spec has no ITL objective) and an override.
ALL_KINDS_SPEC = {
    "version": 1,
    "objectives": [
        {"name": "availability", "sli": "availability", "target": 99.9},
        {
            "name": "ttft",
            "sli": "ttft",
            "target": 95,
            "threshold_seconds": 0.5,
            "models": {"big": {"threshold_seconds": 10.0}},
        },
        {"name": "tpot", "sli": "tpot", "target": 95, "threshold_seconds": 0.05},
        {"name": "itl", "sli": "itl", "target": 99, "threshold_seconds": 0.1},
        {"name": "e2e", "sli": "e2e", "target": 99, "threshold_seconds": 30.0},
        {
            "name": "ttft-long",
            "sli": "ttft",
            "target": 90,
            "threshold_seconds": 10.0,
            "prompt_class": "all",
        },
        {
            "name": "ttft-prefill",
            "sli": "ttft",
            "target": 95,
            "threshold_seconds": 1.0,
            "cache_class": "none",
        },
    ],
}

# name{matchers} — metric names of the sidecar (llm_...), recorded series (llm:...) and `up`.
SELECTOR = re.compile(r"(?<![\w:])(llm_[a-z_]+|llm:[a-z0-9_:]+|up)\b(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
BY = re.compile(r"\bby \(([^)]*)\)")


_chunk = partial(chat_chunk, id="c1", logprobs=False, spaced=True)
HELD = web.AppKey("held", asyncio.Event)


async def _chat(request: web.Request) -> web.StreamResponse:
    """Streamed tokens, a JSON answer, or a 500, as the test asks."""
    body = await request.json()
    if request.headers.get("x-fail"):
        return web.json_response({"error": {"message": "boom"}}, status=500)
    if not body.get("stream"):
        return web.json_response(
            {"id": "c1", "object": "chat.completion", "model": "m1",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                       "prompt_tokens_details": {"cached_tokens": 0}}}
        )  # fmt: skip
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    hold = request.headers.get("x-hold")
    if hold:  # a stream in flight while the page is read (the live view's families)
        await resp.write(_chunk("Hel"))
        await request.app[HELD].wait()
    for data in (
        _chunk(role=True),
        _chunk("Hel"),
        _chunk("lo"),
        _chunk(" you", finish="stop"),
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"m1","choices":[],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6,'
        b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n',
        b"data: [DONE]\n\n",
    ):
        await resp.write(data)
        await asyncio.sleep(0.005)
    await resp.write_eof()
    return resp


@pytest.fixture
async def exported(upstream, sidecar_factory):
    """{sample name: {label name: {values}}} from a live sidecar's /metrics."""
    held = asyncio.Event()

    def routes(app: web.Application) -> None:
        app[HELD] = held
        app.router.add_post("/v1/chat/completions", _chat)

    up = await upstream.start(routes)
    sc = await sidecar_factory(up.url, stall_seconds=1.0)  # the held stream stalls
    url = f"{sc.url}/v1/chat/completions"
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json={**body, "stream": True}) as r:
            assert r.status == 200
            await r.read()
        async with s.post(url, json=body) as r:
            assert r.status == 200
            await r.read()
        async with s.post(url, json=body, headers={"x-fail": "1"}) as r:
            assert r.status == 500
        route = {"model": "m1", "route": "/v1/chat/completions"}
        await wait_for(
            lambda: sc.sample("llm_requests_total", **route, code="500", outcome="error") == 1
        )
        await wait_for(lambda: sc.sample("llm_requests_within_slo_total", model="m1") == 2)
        stream = await s.post(url, json={**body, "stream": True}, headers={"x-hold": "1"})
        await stream.content.readany()  # its first token is in: decoding
        await asyncio.sleep(1.2)  # then nothing past --stall-seconds: llm_streams_stalled
        async with s.get(f"{sc.admin_url}/metrics") as r:
            text = await r.text()
        held.set()
        await stream.read()
        stream.release()
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = out[sample.name]
            for k, v in sample.labels.items():
                labels[k].add(v)
    return out


RAW_OF_RECORD = {a.record: a.series for a in aggregates.AGGREGATES}
"""The aggregates group's records and the raw series each sums."""


def rule_sources() -> list[tuple[str, dict]]:
    docs = [(p.name, yaml.safe_load(p.read_text(encoding="utf-8"))) for p in RULE_FILES]
    docs.append(("all kinds", yaml.safe_load(render_rules(generate(parse_spec(ALL_KINDS_SPEC))))))
    return docs


def test_rules_reference_only_what_the_sidecar_exports(exported):
    assert RULE_FILES, "no committed rules under deploy/prometheus/"
    for name in (
        c.REQUESTS_TOTAL,
        c.REQUESTS_WITHIN_SLO_TOTAL,
        *(f"{s.histogram}_bucket" for s in c.LATENCY_SLIS.values()),
    ):
        assert name in exported, f"{name} missing from /metrics"
    outcomes = {o.value for o in Outcome}
    checked = 0
    for source, doc in rule_sources():
        rules = [r for g in doc["groups"] for r in g["rules"]]
        # Labels each recorded series carries: its static labels plus the `by` labels.
        recorded: dict[str, set[str]] = defaultdict(set)
        for r in rules:
            if "record" in r:
                recorded[r["record"]] |= set(r.get("labels", {}))
                for by in BY.findall(r["expr"]):
                    recorded[r["record"]] |= {x.strip() for x in by.split(",")}
        # The dashboards' records read what the panels need, every family: checked against a
        # page that has them all in tests/unit/tools/dashboards/test_dashboards_metrics.py.
        slo_rules = [r for g in doc["groups"] if g["name"] != aggregates.GROUP for r in g["rules"]]
        for r in slo_rules:
            texts = [r["expr"], *r.get("annotations", {}).values()]
            for text in texts:
                names = []
                # A label name in by (...) (llm_release) is no selector.
                for metric, body in SELECTOR.findall(BY.sub("", text)):
                    matchers = MATCHER.findall(body or "")
                    where = f"{source}: {r.get('record') or r.get('alert')}: {metric}{body}"
                    if metric == "up":
                        assert {m[0] for m in matchers} <= {"job"}, where
                        continue
                    if metric.startswith("llm:"):
                        assert metric in recorded, f"{where}: not a recording rule in the file"
                        assert {m[0] for m in matchers} <= recorded[metric], where
                        # An SLO's threshold read from the aggregates' bucket record: the
                        # bucket must be one the sidecar writes, as on the raw series.
                        raw = RAW_OF_RECORD.get(metric)
                        for label, op, value in matchers:
                            if raw is not None and label == "le":
                                assert op == "=" and value in exported[raw]["le"], (
                                    f"{where}: {raw} has no bucket le={value!r}"
                                )
                                checked += 1
                        continue
                    assert metric in exported, f"{where}: not exported by the sidecar"
                    names.append(metric)
                    labels = exported[metric]
                    for label, op, value in matchers:
                        assert label in labels, (
                            f"{where}: the sidecar has no label {label!r} on {metric}"
                        )
                        if label == "le":
                            assert op == "=" and value in labels["le"], (
                                f"{where}: no bucket le={value!r}"
                            )
                        if label == "outcome":
                            assert value in outcomes, where
                    checked += 1
                for by in BY.findall(text):
                    for label in (x.strip() for x in by.split(",")):
                        # by (le) aggregates the buckets; a _count beside them in the same
                        # expression (the capacity rules' sample floor) has no le to keep.
                        for metric in [n for n in names if label != "le" or n.endswith("_bucket")]:
                            # The grouping's target labels come from the scrape, not the sidecar.
                            assert label in exported[metric] or label in c.TARGET_LABELS, (
                                f"{source}: by ({label}) but {metric} has no {label}"
                            )
    assert checked > 25  # the selectors of raw series and buckets: the rest read recorded rates


def test_le_values_in_rules_are_written_as_the_sidecar_writes_them(exported):
    """prometheus_client writes 2.0 as "2.0" and 60.0 as "60.0"; a rule with le="2" would read nothing."""
    les = set(re.findall(r'le="([^"]+)"', RULE_FILES[0].read_text(encoding="utf-8")))
    # ttft, tpot, e2e (no per-model override is shipped); +Inf: a count rate read from its
    # bucket record's +Inf series.
    assert les == {"2.0", "0.1", "60.0", "+Inf"}
    written = set().union(
        *(exported[f"{s.histogram}_bucket"]["le"] for s in c.LATENCY_SLIS.values())
    )
    assert les <= written
