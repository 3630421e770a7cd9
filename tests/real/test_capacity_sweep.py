"""The throughput-latency curve against an independent load generator.

aiperf (from PyPI, scripts/install-aiperf.sh) sweeps closed-loop concurrency 1, 2, 4 and 8
(streamed chat, 64 output tokens, ``ROUNDS`` requests per stream) through one sidecar in
front of real vLLM (CPU, tiny random model). Per level:

- the sidecar's mean inter-token latency over every gap the level produced, whatever band
  each gap landed in (delta sum / delta count of
  ``llm_inter_token_latency_by_concurrency_seconds`` summed over bands), is within 5 % of
  the mean of aiperf's own gaps between the chunks it received (from its raw export), and
  the two count the same gaps, less at most one a request. The all-band mean is the
  like-for-like figure: aiperf's gaps cover every request of the level, including the ramp
  at the start and the tail at the end, where fewer than N streams are decoding and the
  sidecar files the gap in a lower band. The band of the level (band N) must still hold
  nearly all of them (``DOMINANT``), and its own mean is printed beside;
- the by-concurrency counts sum to the plain ITL histogram's count.

Both sides time chunks, not tokens: the sidecar files one gap per chunk (the gap a client
waits), and when vLLM merges the deltas of a request whose stream it serves late (its API
server's loop behind on these loaded cores: one run merged 132 of level 4's 1008 tokens
into other chunks) one gap spans several tokens on both sides. aiperf's summary ITL is per
token, ``(last content chunk - first content chunk) / (OSL - 1)`` averaged over requests,
so a merge makes it lower than either side's per-chunk mean by the share of tokens merged
(that run: aiperf 5.20 ms a token, the sidecar 5.98 ms a chunk, over the same 5.24 s of
decoding): it is printed beside, not compared. Its OSL is by default the *re-tokenized
answer text*: for the tiny random model's output that is 73-75 tokens for 64 generated
(vLLM's usage says 64); ``--use-server-token-count`` makes it take vLLM's usage count, so
the per-token figure printed is per generated token.

Then the capacity rule: a real Prometheus (Debian's) scrapes the sidecar every second
during the sweep. The threshold and the expected band come from aiperf alone: every
token's receive time from its raw export (``--export-level raw``) gives each level's
per-token gaps. aiperf's own figures will not do: the rule reads a quantile of single
gaps, aiperf's "ITL p95" is a quantile of per-request means, and its
``inter_chunk_latency`` skips vLLM's empty-content chunks, merging two gaps. A p95 ITL
objective at bound T is met by a level when at least 95 % of its gaps are within T; of the
ITL bucket bounds (a spec's threshold must be one) that some level meets and some fails,
the test takes the one whose closest level is farthest from 95 %, and the expected capacity
is the largest level meeting it (where no bound separates the levels fairly, a bound every
level meets, and the largest level: choose_threshold). The rules ``llm-sidecar slo
render`` generates for a spec with that ITL objective (p95) are then loaded (SIGHUP) and evaluated by Prometheus over the
scraped series, unchanged: their 1h windows cover the whole sweep, which is the data
wanted, so nothing is shortened. ``llm:slo_capacity:concurrency`` must be the expected
band. Prometheus's own count and share per band over the window are printed beside the
sidecar's registry (they differed by 20-25 % until each band's series existed at zero
before the load reached it: the lowest three bands at a model's first stream, then the two
above each band the load enters, sidecar/export/capacity.py).

The curve itself is not asserted: on 2 cores shared with other jobs, CPU contention, not
batching, sets most of the latency, and it is not monotone in concurrency.

The table (also in docs/capacity.md, "Measured against real vLLM") is printed with ``-s``.
vLLM warms up with a few requests sent to it directly, not through the sidecar, so both
sides see exactly the same requests. Skipped without aiperf or prometheus locally; fails
under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client.utils import floatToGoString

from sidecar.base.buckets import ITL_BUCKETS
from sidecar.measure.concurrency import BANDS, band
from sidecar.tools.slo.capacity import (
    CAPACITY,
    CAPACITY_GROUP,
    CAPACITY_TPS,
    WITHIN_HOUR,
    capacity_group,
    generate,
)
from sidecar.tools.slo.render import render_rules
from sidecar.tools.slo.spec import parse_spec
from tests.real.servers import AIPERF, HF_MODEL, MODEL, VLLM, require_aiperf
from tests.support.processes import start_prometheus
from tests.support.samples import outcome_counts
from tests.support.tools import require_tool
from tests.support.waits import wait_for

pytestmark = pytest.mark.real

LEVELS = (1, 2, 4, 8)  # vLLM runs with --max-num-seqs 8 (tests/real/servers.py)
ROUNDS = 4  # requests per level = ROUNDS * level
OUTPUT_TOKENS = 64
TOLERANCE = 0.05  # the per-chunk means; both time the same chunks, a relay hop apart
DOMINANT = 0.9  # share of a level's gaps in its own band, at least
ITL = "llm_inter_token_latency_by_concurrency_seconds"
PLAIN_ITL = "llm_inter_token_latency_seconds"


def band_figures(registry) -> dict:
    """{(name, band, le): value} for the by-concurrency series of the tiny model."""
    out: dict = {}
    wanted = (ITL + "_sum", ITL + "_count", ITL + "_bucket", PLAIN_ITL + "_count",
              "llm_decode_seconds_by_concurrency_total")  # fmt: skip
    for family in registry.collect():
        for s in family.samples:
            if s.name in wanted and s.labels.get("model") == MODEL:
                key = (s.name, s.labels.get("concurrency"), s.labels.get("le"))
                out[key] = out.get(key, 0.0) + s.value
    return out


def delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def fraction_within(d: dict, b: str, bound: float) -> float | None:
    """Share of band ``b``'s gaps in ``d`` at or below the bucket bound ``bound``."""
    count = d.get((ITL + "_count", b, None), 0.0)
    if not count:
        return None
    return d.get((ITL + "_bucket", b, floatToGoString(bound)), 0.0) / count


async def run_aiperf(url: str, level: int, artifacts, tmp_path) -> tuple[dict, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
    process = await asyncio.create_subprocess_exec(
        str(AIPERF), "profile",
        "--model", MODEL, "--tokenizer", str(HF_MODEL),
        "--url", url, "--endpoint-type", "chat", "--streaming",
        "--request-count", str(ROUNDS * level), "--concurrency", str(level),
        "--isl", "32", "--isl-stddev", "0", "--osl", str(OUTPUT_TOKENS), "--osl-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{OUTPUT_TOKENS}",
        "--use-server-token-count",  # OSL from vLLM's usage, not re-tokenized text (module doc)
        "--random-seed", "1", "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
        "--export-level", "raw", "--artifact-dir", str(artifacts),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), timeout=300)
    text = output.decode(errors="replace")
    assert process.returncode == 0, text[-4000:]
    (summary,) = list(artifacts.rglob("profile_export_aiperf.json"))
    return json.loads(summary.read_text()), text


def token_times(record: dict) -> list[int]:
    """aiperf's receive time (perf_ns) of each generated token of one raw record: a chunk
    with text, or one with an empty ``content`` after the first token (vLLM's token whose
    bytes are not yet a whole character), not the role-only first chunk, the usage chunk or
    ``[DONE]``. Chunks of one read share a timestamp. That is one per token unless vLLM
    sent several tokens in one chunk (it merges the deltas of a request whose stream is
    read late, as on these loaded cores): then one gap spans them, as in the sidecar, which
    counts one token per chunk without per-chunk usage. The sidecar does not count an empty ``content`` on the chunk
    that carries ``finish_reason`` (sidecar/streams/protocols/openai.py), so a request that
    ends on a split character loses its last gap there: the table shows both counts."""
    times: list[int] = []
    for response in record.get("responses") or []:
        for packet in response.get("packets") or []:
            if packet.get("name") != "data" or packet.get("value") in (None, "[DONE]"):
                continue
            for choice in json.loads(packet["value"]).get("choices") or []:
                delta = choice.get("delta") or {}
                content = delta.get("content")
                if content or delta.get("reasoning_content") or delta.get("reasoning"):
                    times.append(response["perf_ns"])
                elif times and content == "" and "role" not in delta:
                    times.append(response["perf_ns"])
    return times


def token_gaps(artifacts) -> list[float]:
    """Every gap between consecutive tokens of every request, in seconds, by aiperf's clock."""
    (raw,) = list(artifacts.rglob("profile_export_raw.jsonl"))
    gaps: list[float] = []
    for line in raw.read_text().splitlines():
        if line.strip():
            times = token_times(json.loads(line))
            assert 0 < len(times) <= OUTPUT_TOKENS, len(times)
            gaps.extend((b - a) / 1e9 for a, b in zip(times, times[1:], strict=False))
    return gaps


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def stream_chats(url: str, content: str, max_tokens: int, n: int = 1) -> None:
    """``n`` streamed chat requests to ``url``, one after the other, each read whole."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()


async def warm_up(url: str, n: int = 3) -> None:
    """A few streamed requests straight to vLLM (not through the sidecar)."""
    await stream_chats(url, "warm up", 16, n)


async def prime_bands(url: str) -> None:
    """One streamed request of one token through the sidecar at ``url``: the model's
    capacity bands are made (at zero) and no gap is observed (a first token has none)."""
    await stream_chats(url, "prime", 1)


async def prom_query(session: aiohttp.ClientSession, base: str, query: str) -> list:
    async with session.get(f"{base}/api/v1/query", params={"query": query}) as r:
        doc = await r.json()
        assert r.status == 200 and doc["status"] == "success", f"{query}: {r.status} {doc}"
        return doc["data"]["result"]


def choose_threshold(
    gaps_by_level: dict[int, list[float]],
    band_share: Callable[[int, float], float | None] | None = None,
) -> tuple[float, int, float, bool]:
    """(threshold, expected capacity level, margin, separated) from the generator's gaps.

    A p95 objective at bound T is met by a level when at least 95 % of its gaps are <= T
    (what the rule's histogram_quantile says at a bucket bound, interpolation aside). Of
    the ITL bucket bounds that some level meets and some fails, the one whose closest
    level is farthest from 95 % (margin, in shares); capacity = the largest level meeting.

    ``band_share(level, T)``: the share the rule itself judges, the level's band over the
    whole sweep (which also holds the few gaps streams made in that band while ramping at
    other levels). A bound where it disagrees with the generator, or sits closer to 95 %,
    is not a fair question: one run chose a bound with level 1 at 99.2 % for aiperf but its
    band at 96.1 % over the sweep, and Prometheus's extrapolated 1h view put that at 95.0 %.

    When no bound separates the levels fairly (a quiet machine where every level's p95 gap
    lies within a bucket or two of the others: 13.6, 16.5, 20.3 and 19.9 ms in one run, each
    separating bound within a point of 95 % for some band), the question left is a bound
    every level meets, so the capacity is the largest level (``separated`` False): the rule
    must still find every band's share in its window and take the largest."""
    best = None
    every_level_meets = None
    for bound in ITL_BUCKETS:
        shares = {
            lvl: sum(g <= bound for g in gaps) / len(gaps) for lvl, gaps in gaps_by_level.items()
        }
        meeting = [lvl for lvl, f in shares.items() if f >= 0.95]
        if not meeting:
            continue
        margin = min(abs(f - 0.95) for f in shares.values())
        if band_share is not None:
            judged = {lvl: band_share(lvl, bound) for lvl in shares}
            if any(j is None or (j >= 0.95) != (shares[lvl] >= 0.95) for lvl, j in judged.items()):
                continue
            margin = min(margin, *(abs(j - 0.95) for j in judged.values() if j is not None))
        if len(meeting) == len(shares):
            if every_level_meets is None or margin > every_level_meets[2]:
                every_level_meets = (bound, max(meeting), margin, False)
        elif best is None or margin > best[2]:
            best = (bound, max(meeting), margin, True)
    best = best or every_level_meets
    assert best is not None, (
        "no ITL bucket bound is a fair question for the levels' p95 gaps: "
        + str({lvl: quantile(g, 0.95) for lvl, g in gaps_by_level.items()})
    )
    return best


async def test_sidecar_curve_matches_aiperf_sweep(live_servers, sidecar_factory, tmp_path):
    require_aiperf()
    prometheus = require_tool("prometheus")
    t_session = time.monotonic()
    server = live_servers.get(VLLM)
    t_start = time.monotonic()
    cold = server.ready_after
    running = await sidecar_factory(server.url)
    await warm_up(server.url)

    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text("groups: []\n", encoding="utf-8")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            {
                "job_name": "llm-sidecar",
                "static_configs": [{"targets": [f"127.0.0.1:{running.admin_port}"]}],
            }
        ],
    }
    proc, port = start_prometheus(prometheus, tmp_path, config)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            # Ready, and the sidecar scraped at least once before any traffic.
            async def scraped() -> bool:
                try:
                    return bool(await prom_query(session, base, 'up{job="llm-sidecar"} == 1'))
                except (aiohttp.ClientError, AssertionError):
                    return False

            await wait_for(scraped, timeout=60)
            # The capacity bands' series are made at zero at the model's first stream, but a
            # series' first sample is never counted by increase(): when no scrape fell within
            # that first request, the rule's 1h window lost its ~60 gaps (Prometheus held 230
            # of band 1's 286 in one run, and its verdict flipped). A one-token stream makes
            # them with no gap to observe, and two scrapes later Prometheus holds their zero.
            await prime_bands(running.url)
            await asyncio.sleep(2.5)

            rows = []
            gaps_by_level: dict[int, list[float]] = {}
            requests = 1  # the priming stream
            for level in LEVELS:
                before = band_figures(running.registry)
                t0 = time.monotonic()
                summary, output = await run_aiperf(
                    running.url, level, tmp_path / f"aiperf-c{level}", tmp_path
                )
                wall = time.monotonic() - t0
                gaps_by_level[level] = token_gaps(tmp_path / f"aiperf-c{level}")
                requests += ROUNDS * level
                # Each request is filed just after its connection ends; aiperf may exit first.
                await wait_for(
                    lambda requests=requests: (
                        sum(outcome_counts(running.registry).values()) == requests
                    ),
                    timeout=30,
                )
                assert outcome_counts(running.registry) == {"ok": requests}, output[-3000:]
                d = delta(band_figures(running.registry), before)
                counts = {b: d.get((ITL + "_count", b, None), 0.0) for b in BANDS}
                total = sum(counts.values())
                assert total == d[(PLAIN_ITL + "_count", None, None)]
                own = band(level)
                assert summary["request_count"]["avg"] == ROUNDS * level, summary["request_count"]
                rows.append(
                    {
                        "level": level,
                        "aiperf_itl": summary["inter_token_latency"]["avg"] / 1000,
                        "aiperf_itl_p95": summary["inter_token_latency"]["p95"] / 1000,
                        "aiperf_icl_p95": summary["inter_chunk_latency"]["p95"] / 1000,
                        "aiperf_gap_p95": quantile(gaps_by_level[level], 0.95),
                        "aiperf_gaps": len(gaps_by_level[level]),
                        "aiperf_gap_mean": sum(gaps_by_level[level]) / len(gaps_by_level[level]),
                        "aiperf_tps": summary["output_token_throughput"]["avg"],
                        "aiperf_osl": summary["output_sequence_length"]["avg"],
                        "gaps": total,
                        "bands": {b: int(c) for b, c in counts.items() if c},
                        "sidecar_itl": sum(d.get((ITL + "_sum", b, None), 0.0) for b in BANDS)
                        / total,
                        "band_itl": d[(ITL + "_sum", own, None)] / counts[own],
                        "share": counts[own] / total,
                        "band_tps": d[(ITL + "_count", own, None)]  # one gap a decode token
                        / d[("llm_decode_seconds_by_concurrency_total", own, None)],
                        "delta": d,
                        "wall": wall,
                    }
                )

            print(
                "\nsweep:", json.dumps([{k: v for k, v in r.items() if k != "delta"} for r in rows])
            )
            # The threshold, from aiperf's sweep alone.
            totals = band_figures(
                running.registry
            )  # the whole sweep, as the rule's 1h window sees it
            threshold, expected, margin, separated = choose_threshold(
                gaps_by_level, lambda level, bound: fraction_within(totals, band(level), bound)
            )
            spec = parse_spec(
                {
                    "version": 1,
                    "objectives": [
                        {"name": "itl", "sli": "itl", "target": 95, "threshold_seconds": threshold}
                    ],
                }
            )
            assert capacity_group(spec) is not None
            rules_file.write_text(render_rules(generate(spec)), encoding="utf-8")
            proc.send_signal(signal.SIGHUP)

            async def capacity_group_evaluated() -> bool:
                async with session.get(f"{base}/api/v1/rules") as r:
                    groups = (await r.json())["data"]["groups"]
                return any(
                    g["name"] == CAPACITY_GROUP and g.get("evaluationTime", 0) > 0 for g in groups
                )

            await wait_for(capacity_group_evaluated, timeout=30)
            await asyncio.sleep(2)  # one more whole evaluation after the reload
            result = await prom_query(session, base, CAPACITY)
            capacity = result[0] if result else None
            rule_shares = {
                s["metric"]["concurrency"]: float(s["value"][1])
                for s in await prom_query(session, base, WITHIN_HOUR)
            }
            tps = await prom_query(session, base, CAPACITY_TPS)
            # What the rule's 1h window holds per band: gaps, and the share within the threshold.
            window = f"sum by (concurrency) (increase({ITL}_count[1h]))"
            prom_gaps = {
                s["metric"]["concurrency"]: float(s["value"][1])
                for s in await prom_query(session, base, window)
            }
            within = f'sum by (concurrency) (increase({ITL}_bucket{{le="{floatToGoString(threshold)}"}}[1h])) / {window}'
            prom_share = {
                s["metric"]["concurrency"]: float(s["value"][1])
                for s in await prom_query(session, base, within)
            }
            async with session.get(f"{base}/api/v1/rules") as r:
                groups = (await r.json())["data"]["groups"]
            bad = [
                (r.get("name"), r.get("lastError"))
                for g in groups
                for r in g["rules"]
                if r.get("health") != "ok"
            ]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    elapsed = time.monotonic() - t_start

    own_bands = {r["level"]: band(r["level"]) for r in rows}
    lines = [
        f"vLLM {server.version()} on CPU (2 shared cores), tiny random model (tests/real); aiperf "
        f"{summary['aiperf_version']} closed loop, streamed chat, {OUTPUT_TOKENS} output tokens, "
        f"{ROUNDS} requests per stream per level.",
        "",
        "| level | aiperf mean ITL (per token) | aiperf mean gap (per chunk) "
        "| sidecar mean gap, all bands | diff | gaps: tokens, aiperf chunks, sidecar "
        "| sidecar gaps by band "
        "| sidecar band-N mean ITL "
        "| aiperf p95 ITL (per request) | aiperf p95 gap (per token) | aiperf tok/s | sidecar band-N tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = r["sidecar_itl"] / r["aiperf_gap_mean"] - 1
        bands = ", ".join(f"{b}: {c}" for b, c in r["bands"].items())
        lines.append(
            f"| {r['level']} | {1000 * r['aiperf_itl']:.2f} ms | {1000 * r['aiperf_gap_mean']:.2f} ms "
            f"| {1000 * r['sidecar_itl']:.2f} ms | {100 * diff:+.1f} % "
            f"| {ROUNDS * r['level'] * (OUTPUT_TOKENS - 1)}, {r['aiperf_gaps']}, {r['gaps']:.0f} | {bands} "
            f"| {1000 * r['band_itl']:.2f} ms | {1000 * r['aiperf_itl_p95']:.1f} ms "
            f"| {1000 * r['aiperf_gap_p95']:.1f} ms | {r['aiperf_tps']:.1f} | {r['band_tps']:.1f} |"
        )
    lines += [
        "",
        f"Capacity at a p95 ITL objective of {threshold:g} s (the bucket bound that best separates aiperf's levels; "
        f"closest level {100 * margin:.1f} points from 95 %):"
        if separated
        else f"Capacity at a p95 ITL objective of {threshold:g} s (no bucket bound separated aiperf's levels fairly, "
        f"so one every level meets; closest level {100 * margin:.1f} points from 95 %):",
        "",
        f"| level | aiperf: gaps <= {threshold:g} s | sidecar band N, this level | sidecar band N, whole sweep "
        "| Prometheus 1h: gaps, share | rule's share (Prometheus, 1h) | meets (aiperf) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        own = own_bands[r["level"]]
        mine = sum(g <= threshold for g in gaps_by_level[r["level"]]) / len(
            gaps_by_level[r["level"]]
        )
        level_share = fraction_within(r["delta"], own, threshold)
        sweep_share = fraction_within(totals, own, threshold)
        rule_share = rule_shares.get(own)
        lines.append(
            f"| {r['level']} | {100 * mine:.1f} % | {100 * (level_share or 0):.1f} % | {100 * (sweep_share or 0):.1f} % "
            f"| {prom_gaps.get(own, 0):.0f} of {totals.get((ITL + '_count', own, None), 0):.0f}, "
            f"{100 * prom_share.get(own, float('nan')):.1f} % "
            f"| {'-' if rule_share is None else f'{100 * rule_share:.1f} %'} | {'yes' if mine >= 0.95 else 'no'} |"
        )
    got = None if capacity is None else capacity["value"][1]
    walls = ", ".join(f"c{r['level']} {r['wall']:.0f} s" for r in rows)
    lines += [
        "",
        f"aiperf's sweep: capacity {expected} streams; `{CAPACITY}` = {got}, "
        f"`{CAPACITY_TPS}` = {tps[0]['value'][1] if tps else '-'}.",
        f"Wall: vLLM cold start {cold:.0f} s; test body (sidecar, Prometheus, 4 aiperf runs, rules) {elapsed:.0f} s; "
        f"test including the wait for vLLM {time.monotonic() - t_session:.0f} s; aiperf runs {walls}.",
    ]
    print("\n" + "\n".join(lines))
    (tmp_path / "table.md").write_text("\n".join(lines) + "\n")

    for r in rows:
        assert r["aiperf_osl"] == OUTPUT_TOKENS, r
        assert abs(r["sidecar_itl"] / r["aiperf_gap_mean"] - 1) <= TOLERANCE, r
        # The sidecar skips an empty content on a request's finishing chunk (token_times).
        assert 0 <= r["aiperf_gaps"] - r["gaps"] <= ROUNDS * r["level"], r
        assert r["share"] >= DOMINANT, r
    assert not bad, bad
    # The rule's share per band (its 2m rates' means over the hour) is the raw hour's share,
    # up to the edges its 2m windows taper.
    for own, share in rule_shares.items():
        assert abs(share - prom_share[own]) <= 0.05, ("\n".join(lines), own)
    assert got == str(expected), "\n".join(lines)
