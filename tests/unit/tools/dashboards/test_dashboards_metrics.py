"""Every metric a dashboard names is one the sidecar exports or a rule records (or, for the
engine row's vllm:* series, one the simulated vLLM exports on the admin port's /metrics/engine).

The reference is a live sidecar's /metrics: a sidecar in front of the simulator relays
streamed, reasoning, Ollama (engine timings), whole, failed and cancelled requests, and a
second one in front of a scripted server that streams an unparseable event (so
llm_stream_parse_errors_total has a sample too). Every family must then have samples, so
its label names and values are known.

Each dashboard query (and each variable's label_values()) is taken apart: every bare
identifier must be a function, a keyword or a metric; a raw metric must be a sample name in
/metrics; its matchers may only use its labels or the target labels Prometheus adds
(namespace, pod); `le` values must be bucket bounds written exactly as the sidecar writes
them; outcome and type values must be ones the sidecar emits; `by`/`on` labels must exist on
the metrics they group. A recorded `llm:*` series must be recorded by the committed rules
with the labels the query uses; `ALERTS` must name alerts those rules define.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from functools import partial

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from sidecar.tools.dashboards.inspect import panel_queries, variable_queries
from sidecar.tools.dashboards.queries import TARGET_LABELS
from sidecar.tools.sim.core import SimulatorConfig
from sidecar.tools.sim.server import build_simulator_app
from sidecar.tools.slo import load_spec, render_rules
from sidecar.tools.slo.helm import release_rules
from tests.support.in_process import start_app
from tests.support.paths import ROOT
from tests.support.sse import chat_chunk
from tests.support.waits import wait_for

DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
_PLAIN = yaml.safe_load(
    (ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml").read_text(encoding="utf-8")
)
# The committed rules and the same rules as one Helm release applies them (they also carry
# namespace and deployment): the dashboards read both.
_RELEASE = yaml.safe_load(
    render_rules(
        release_rules(
            load_spec(str(ROOT / "deploy" / "slo" / "default.yaml")), "llm", "llm-sidecar"
        )
    )
)
RULES = {"groups": _PLAIN["groups"] + _RELEASE["groups"]}
MODEL = "sim-llama-3-8b"
FAST = {"x-sim-ttft": "0.01", "x-sim-tpot": "0.002", "x-sim-tokens": "5"}

FUNCTIONS = {
    "sum",
    "max",
    "count",
    "rate",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "vector",
    "label_replace",
    "topk",
    "bottomk",
    "avg_over_time",
    "sum_over_time",
    "last_over_time",
    "increase",
    "absent",
    "min",
    "timestamp",
    "time",
}
KEYWORDS = {"by", "on", "and", "or"}
GROUPING = re.compile(r"\b(by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
IDENT = re.compile(r"[A-Za-z_:][\w:]*")
LIVE_FAMILIES = (  # read from the requests in flight (sidecar/export/in_flight.py)
    "llm_requests_in_phase",
    "llm_requests_in_phase_oldest_seconds",
    "llm_streams_stalled",
)
SCRAPE_LABELS = {"job", "instance"}  # Prometheus adds them to every scraped series
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


_sse_chunk = partial(chat_chunk, id="c1", model=MODEL, logprobs=False, spaced=True)


async def _garbled(request: web.Request) -> web.StreamResponse:
    """A stream with one event no dialect can read between two good ones."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for data in (
        _sse_chunk("Hel"),
        b"data: {this is not json\n\n",
        _sse_chunk("lo"),
        b"data: [DONE]\n\n",
    ):
        await resp.write(data)
    await resp.write_eof()
    return resp


async def _vllm_per_request_metrics(request: web.Request) -> web.StreamResponse:
    """A real vLLM 0.32 stream whose usage chunk carries per-request metrics (queue time)."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(
        (
            ROOT
            / "tests"
            / "fixtures"
            / "streams"
            / "openai"
            / "vllm032_chat_per_request_metrics.txt"
        ).read_bytes()
    )
    await resp.write_eof()
    return resp


def _bad_upstream(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", _garbled)
    app.router.add_post("/v1/completions", _vllm_per_request_metrics)


@pytest.fixture
async def exported(upstream, sidecar_factory):
    """{sample name: {label name: {values}}} from live sidecars' /metrics."""
    sim_runner, sim_port = await start_app(
        build_simulator_app(SimulatorConfig(model=MODEL, jitter=0.0, seed=3)),
        handler_cancellation=True,
    )
    try:
        up = await upstream.start(_bad_upstream)
        sim_sc = await sidecar_factory(f"http://127.0.0.1:{sim_port}", stall_seconds=1.0)
        bad_sc = await sidecar_factory(up.url)
        msgs = [{"role": "user", "content": "hi"}]
        chat = f"{sim_sc.url}/v1/chat/completions"
        stream = {"model": MODEL, "messages": msgs, "stream": True}
        # The simulator lists its model (/v1/models): a name it does not list is "other".
        await wait_for(lambda: sim_sc.sidecar.metrics.model_label.authoritative)
        async with aiohttp.ClientSession() as s:
            for url, body, headers in (
                (chat, stream, FAST),
                (chat, {**stream, "model": "no-such-model"}, FAST),
                (chat, stream, {**FAST, "x-sim-reasoning": "2"}),
                # Usage with a cached count: a prefix-cache class of its own.
                (
                    chat,
                    {**stream, "stream_options": {"include_usage": True}},
                    {**FAST, "x-sim-cached-tokens": "1"},
                ),
                (chat, {"model": MODEL, "messages": msgs}, FAST),
                (chat, stream, {**FAST, "x-sim-fail": "500"}),
                # Tool calls, and an objective header that is not a number (ignored, counted).
                (chat, stream, {**FAST, "x-sim-tool-calls": "2", "x-slo-ttft-ms": "fast"}),
                (f"{sim_sc.url}/api/chat", {"model": MODEL, "messages": msgs}, FAST),
                (f"{bad_sc.url}/v1/chat/completions", stream, {}),
                (
                    f"{bad_sc.url}/v1/completions",
                    {"model": MODEL, "prompt": "hi", "stream": True},
                    {},
                ),
            ):
                async with s.post(url, json=body, headers=headers) as r:
                    await r.read()
            async with s.get(
                f"{sim_sc.url}/health"
            ) as r:  # non-API traffic: llm_non_api_requests_total
                await r.read()
            async with s.post(chat, json=stream, headers={**FAST, "x-sim-tpot": "3"}) as r:
                await r.content.readany()
                await asyncio.sleep(1.2)  # no byte past --stall-seconds: llm_streams_stalled
                async with s.get(  # the live in-flight view (filtered: a page of its own)
                    f"{sim_sc.admin_url}/metrics",
                    params=[("name[]", n) for n in LIVE_FAMILIES],
                ) as m:
                    live = await m.text()
                r.close()  # cancelled by the client
            await wait_for(lambda: sim_sc.sample("llm_requests_total", model=MODEL, route="/v1/chat/completions",
                                                 code="200", outcome="cancelled") == 1)  # fmt: skip
            await wait_for(
                lambda: bad_sc.sample("llm_stream_parse_errors_total", route="/v1/chat/completions")
            )
            texts = [live]
            for sc in (sim_sc, bad_sc):
                async with s.get(f"{sc.admin_url}/metrics") as r:
                    texts.append(await r.text())
            # The engine row's vllm:* series: the simulated vLLM's own /metrics, as the
            # chart's second scrape job reads it through the admin port.
            async with s.get(f"{sim_sc.admin_url}/metrics/engine") as r:
                assert r.status == 200
                texts.append(await r.text())
    finally:
        await sim_runner.cleanup()
    # The "where the time goes" row's vllm:* series: a real vLLM 0.32's /metrics, recorded,
    # which Prometheus scrapes beside the sidecar's (tests/real/ runs them live).
    texts.append(
        (ROOT / "tests" / "fixtures" / "real" / "vllm-0.32.0" / "metrics.txt").read_text(
            encoding="utf-8"
        )
    )
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    families = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            families[family.name] = family.type
            for sample in family.samples:
                labels = out[sample.name]
                for k, v in sample.labels.items():
                    labels[k].add(v)
    # Every family the sidecar defines has samples, so no metric is judged on its name alone.
    for name, kind in families.items():
        if name.startswith("llm_"):
            for suffix in SUFFIXES[kind]:
                assert name + suffix in out, (
                    f"{name + suffix} has no sample; drive traffic that creates it"
                )
    return out


def add_rule_labels(out: dict[str, set[str]], kind: str) -> None:
    """Into ``out[name]`` for every rule of ``kind`` (``record`` or ``alert``): its static
    labels plus its `by` labels."""
    for g in RULES["groups"]:
        for r in g["rules"]:
            if kind in r:
                out[r[kind]] |= set(r.get("labels", {}))
                for _, labels in GROUPING.findall(r["expr"]):
                    out[r[kind]] |= {x.strip() for x in labels.split(",") if x.strip()}


def recorded_labels() -> dict[str, set[str]]:
    """Labels each recorded series carries: its static labels plus its `by` labels."""
    out: dict[str, set[str]] = defaultdict(set)
    add_rule_labels(out, "record")
    # A record computed from other records (a ratio of two recorded rates) carries theirs.
    reads = {
        r["record"]: set(re.findall(r"llm:[a-z0-9_:]+", r["expr"]))
        for g in RULES["groups"]
        for r in g["rules"]
        if "record" in r
    }
    changed = True
    while changed:
        changed = False
        for record, sources in reads.items():
            inherited = set().union(*(out[s] for s in sources)) if sources else set()
            if not inherited <= out[record]:
                out[record] |= inherited
                changed = True
    return out


def alert_labels() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(lambda: {"alertname", "alertstate"})
    add_rule_labels(out, "alert")
    # The burn-rate alerts compare `llm:burn_rate:*` series, which carry `model`.
    for name, labels in out.items():
        if name.endswith("BurnRate"):
            labels.add("model")
    return out


def metric_names(expr: str) -> set[str]:
    """Every identifier that is neither a function nor a keyword: the metric names."""
    bare = SELECTOR.sub(lambda m: m[1], expr)  # drop matchers
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', " ", bare)  # drop string arguments (label_replace)
    bare = GROUPING.sub(" ", bare)  # drop grouping label lists
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # drop ranges
    bare = re.sub(r"(?<![\w:.])\d+(\.\d+)?(e[+-]?\d+)?", " ", bare)  # drop numbers
    names = set()
    for m in IDENT.finditer(bare):
        word = m[0]
        if word in KEYWORDS:
            continue
        if bare[m.end() :].lstrip().startswith("("):
            assert word in FUNCTIONS, f"unexpected function {word} in {expr}"
            continue
        names.add(word)
    return names


def check_expr(where: str, expr: str, exported, recorded, alerts) -> int:
    names = metric_names(expr)
    assert names, f"{where}: names no metric"
    group_labels: set[str] = set()
    for metric in names:
        if metric == "ALERTS":
            continue
        if metric.startswith("llm:"):
            assert metric in recorded, f"{where}: {metric} is not recorded by the committed rules"
            group_labels |= recorded[metric]
        else:
            assert metric in exported, f"{where}: {metric} is not exported by the sidecar"
            group_labels |= set(exported[metric]) | set(TARGET_LABELS) | SCRAPE_LABELS
    for metric, body in SELECTOR.findall(expr):
        matchers = MATCHER.findall(body)
        assert len(matchers) == body.count('"') // 2, f"{where}: unparsed matchers {body}"
        if metric == "ALERTS":
            (names_re,) = [v for k, op, v in matchers if k == "alertname"]
            named = names_re.split("|")
            for alert in named:
                assert alert in alerts, f"{where}: no alert {alert} in the rules"
            # Each matched label is on some of them (`model=~"$model|"` also keeps the ones without).
            assert {k for k, _, _ in matchers} <= set().union(*(alerts[a] for a in named)), where
            continue
        if metric.startswith("llm:"):
            assert {k for k, _, _ in matchers} <= recorded[metric], f"{where}: {metric}{{{body}}}"
            continue
        labels = exported[metric]
        for label, op, value in matchers:
            assert label in labels or label in TARGET_LABELS, (
                f"{where}: {metric} has no label {label}"
            )
            if label == "le":
                assert op == "=" and value in labels["le"], (
                    f"{where}: {metric} has no bucket le={value!r}"
                )
            if label in ("outcome", "type") and op in ("=", "!="):
                assert value in labels[label], f"{where}: {metric} never has {label}={value!r}"
    for _, grouped in GROUPING.findall(expr):
        for label in (x.strip() for x in grouped.split(",") if x.strip()):
            assert label in group_labels, f"{where}: groups by {label}, which its metrics lack"
    return len(names)


def test_every_metric_is_exported_or_recorded(exported):
    recorded = recorded_labels()
    alerts = alert_labels()
    assert len(DASHBOARDS) == 2
    used: set[str] = set()
    checked = 0
    for path in DASHBOARDS:
        d = json.loads(path.read_text(encoding="utf-8"))
        for q in panel_queries(d):
            checked += check_expr(q.where, q.expr, exported, recorded, alerts)
            used |= metric_names(q.expr)
        for v in variable_queries(d):
            check_expr(v.where, v.selector, exported, recorded, alerts)
            assert (
                v.label in exported[metric_names(v.selector).pop()] or v.label in TARGET_LABELS
            ), v.where
    assert checked > 150
    # The panels read records: what those read, down to the raw series, is checked the same
    # way (a record of a series the sidecar does not export would be an empty panel).
    rules = {r["record"]: r["expr"] for g in _PLAIN["groups"] for r in g["rules"] if "record" in r}
    pending, seen = sorted(u for u in used if u.startswith("llm:")), set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        assert name in rules, f"{name} is read by a panel and recorded by no rule"
        check_expr(f"rule {name}", rules[name], exported, recorded, alerts)
        reads = metric_names(rules[name])
        used |= reads
        pending += sorted(r for r in reads if r.startswith("llm:"))
    # And the dashboards leave no exported family out.
    families = {
        re.sub(r"_(bucket|count|sum)$", "", n)
        for n in exported
        if n.startswith("llm_") and not n.endswith("_created")
    }
    unused = {f for f in families if not any(u == f or u.startswith(f + "_") for u in used)}
    assert not unused, f"exported but on no dashboard: {sorted(unused)}"


def test_metric_names_finds_every_identifier():
    expr = ('sum by (le) (rate(llm_a_bucket{x="1"}[1m])) / on () group_left () '
            'clamp_max(llm:b:ratio_rate5m{slo="y"}, 2592000) * 0.95 or on () vector(0) - llm_c '
            'or label_replace(vector(0), "route", "(none)", "", "")')  # fmt: skip
    assert metric_names(expr) == {"llm_a_bucket", "llm:b:ratio_rate5m", "llm_c"}
    with pytest.raises(AssertionError, match="unexpected function"):
        metric_names("irate(llm_a[1m])")


def test_the_check_rejects_what_the_sidecar_does_not_export(exported):
    recorded, alerts = recorded_labels(), alert_labels()
    for broken, why in (
        ("sum(rate(llm_request_total[1m]))", "not exported"),
        ('llm_requests_total{namespace=~".*", modle="m"}', "no label modle"),
        ('llm_time_to_first_token_seconds_bucket{le="2"}', "no bucket le='2'"),
        ('llm_requests_total{outcome="failed"}', "never has outcome='failed'"),
        ('llm:sli_error:ratio_rate7m{slo="ttft"}', "not recorded"),
        ('llm:error_budget_remaining:ratio{pod="p"}', "llm:error_budget_remaining:ratio"),
        ('ALERTS{alertname=~"LLMTTFTBurnRate|LLMSlow"}', "no alert LLMSlow"),
        ("sum by (pod_name) (llm_requests_in_flight)", "groups by pod_name"),
    ):
        with pytest.raises(AssertionError, match=re.escape(why)):
            check_expr("broken", broken, exported, recorded, alerts)
