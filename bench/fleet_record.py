"""One pod's /metrics under a realistic mix, recorded over time: the page a fleet benchmark replays.

The production sidecar (``python -m sidecar serve`` with the settings the tree's chart gives it
by default: ``helm template`` of ``helm/llm-sidecar``, its container's ``LLM_SIDECAR_*``
environment, so a changed default is measured as a release would run it) runs in front of three simulated servers, one per model, behind a
small router that sends each request to the server of its model (any other name reaches one of
them and gets vLLM's 404) and answers ``/v1/models`` with the three names, as one engine
serving three models would. Each server runs with vLLM's ``--enable-force-include-usage`` (the
chart's default server flags), so token counts come from usage.

The load is open-loop (Poisson arrivals at ``rate`` a second, seeded), every request drawn by
:func:`draw_request`: one of three models (weights 5:3:2, each its own speed) or, 1 in 18, a
model no server serves (a 404); 75 % chat, 25 % completions; 80 % streamed; 3 % answered 500,
2 % of streams cut by the server mid-way and 5 % cancelled by the client after a few chunks;
some streamed chat answers are tool calls and some prompts read from the prefix cache. Every request
carries ``x-sim-*`` headers with its own first-token time, token gap and length (lognormal,
with a slow tail past the 2 s TTFT objective), so the simulated servers add no randomness of
their own and a seed gives the same requests every run.

While the load runs, the sidecar's ``/metrics`` is read every ``every`` seconds; the pages (and
the seconds since the load began at which each was read) are what the fake pods serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import yaml
from aiohttp import web

from bench.fleet_procs import Processes, free_port

MODELS = (
    # (name, weight, mean TTFT seconds, mean seconds a token)
    ("meta-llama/Llama-3.1-8B-Instruct", 5, 0.25, 0.015),
    ("Qwen/Qwen2.5-7B-Instruct", 3, 0.4, 0.02),
    ("mistralai/Mistral-7B-Instruct-v0.3", 2, 0.6, 0.03),
)
UNKNOWN_MODELS = ("gpt-4o", "llama-3-70b", "claude-3-5-sonnet", "text-embedding-3-small")
UNKNOWN_SHARE = 1 / 18
COMPLETIONS_SHARE = 0.25
STREAM_SHARE = 0.8
FAIL_500_SHARE = 0.03
DROP_SHARE = 0.02
CANCEL_SHARE = 0.05
TOOL_CALL_SHARE = 0.05
CACHED_SHARE = 0.4
SLOW_SHARE = 0.04  # first token past the 2 s objective
# The chart's defaults (helm/llm-sidecar/values.yaml sidecar.*) as its Deployment set them when
# this was written: used only where helm is not installed to render the tree's own chart.
CHART_ENV = {
    "LLM_SIDECAR_SLO_TTFT_SECONDS": "2.0",
    "LLM_SIDECAR_SLO_TPOT_SECONDS": "0.1",
    "LLM_SIDECAR_SLO_E2E_SECONDS": "60.0",
    "LLM_SIDECAR_MAX_MODELS": "50",
    "LLM_SIDECAR_WORKERS": "1",
    "LLM_SIDECAR_DRAIN_SECONDS": "30",
    "LLM_SIDECAR_HEALTH_PATH": "/health",
    "LLM_SIDECAR_LOG_FORMAT": "json",
    "LLM_SIDECAR_LOG_LEVEL": "info",
}
# Set by the bench's own flags (addresses), so not taken from the chart.
ADDRESS_ENV = {"LLM_SIDECAR_UPSTREAM", "LLM_SIDECAR_LISTEN", "LLM_SIDECAR_METRICS_LISTEN"}
HERE = Path(__file__).resolve().parent
HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "host", "keep-alive"}


@dataclass(frozen=True)
class Request:
    model: str
    path: str
    stream: bool
    headers: dict[str, str]
    body: bytes
    cancel_after_chunks: int | None


def draw_request(rng: random.Random) -> Request:
    """One request of the mix (see the module docstring)."""
    if rng.random() < UNKNOWN_SHARE:
        model, ttft, tpot = rng.choice(UNKNOWN_MODELS), 0.2, 0.02
    else:
        name, _, ttft, tpot = rng.choices(MODELS, weights=[m[1] for m in MODELS])[0]
        model = name
    chat = rng.random() >= COMPLETIONS_SHARE
    stream = rng.random() < STREAM_SHARE
    first = ttft * rng.lognormvariate(0, 0.5)
    if rng.random() < SLOW_SHARE:
        first = rng.uniform(2.5, 6.0)
    tokens = int(math.exp(rng.uniform(math.log(16), math.log(600))))
    headers = {
        "x-sim-ttft": f"{first:.3f}",
        "x-sim-tpot": f"{tpot * rng.lognormvariate(0, 0.35):.4f}",
        "x-sim-tokens": str(tokens),
    }
    fault = rng.random()
    if fault < FAIL_500_SHARE:
        headers["x-sim-fail"] = "500"
    elif stream and fault < FAIL_500_SHARE + DROP_SHARE:
        headers["x-sim-fail"] = "drop"
    words = int(math.exp(rng.uniform(math.log(20), math.log(3000))))
    text = " ".join(["word"] * words)
    if chat:
        if stream and rng.random() < TOOL_CALL_SHARE:  # the simulator streams tool calls only
            headers["x-sim-tool-calls"] = str(rng.randint(1, 3))
        if rng.random() < CACHED_SHARE:
            headers["x-sim-cached-tokens"] = str(int(words * rng.choice((0.0, 0.3, 0.9))))
        doc: dict = {"model": model, "messages": [{"role": "user", "content": text}]}
        path = "/v1/chat/completions"
    else:
        doc = {"model": model, "prompt": text, "max_tokens": tokens}
        path = "/v1/completions"
    if stream:
        doc["stream"] = True
    cancel = rng.randint(1, 8) if stream and rng.random() < CANCEL_SHARE else None
    return Request(model, path, stream, headers, orjson.dumps(doc), cancel)


# ------------------------------------------------------------------ the router


def build_router(ports: dict[str, int]) -> web.Application:
    """Each request to the simulated server of its body's model (any other name: the first
    server, which answers 404); ``/v1/models`` lists every model."""
    first = next(iter(ports.values()))
    app = web.Application(client_max_size=64 * 2**20)
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session_ctx(app: web.Application):
        app[session_key] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
            auto_decompress=False,
        )
        yield
        await app[session_key].close()

    async def models(request: web.Request) -> web.Response:
        data = []
        for port in ports.values():
            async with app[session_key].get(f"http://127.0.0.1:{port}/v1/models") as r:
                data += (await r.json())["data"]
        return web.json_response({"object": "list", "data": data})

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        port = first
        if body:
            with contextlib.suppress(ValueError, AttributeError):
                port = ports.get(orjson.loads(body).get("model"), first)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = f"http://127.0.0.1:{port}{request.path_qs}"
        async with app[session_key].request(request.method, url, data=body, headers=headers) as up:
            out = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            await out.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
            except aiohttp.ClientPayloadError:
                # The server cut the stream: cut the sidecar's too, as the server would have.
                if request.transport is not None:
                    request.transport.abort()
                return out
            except ConnectionResetError:
                return out  # the sidecar's client left, and the sidecar with it
            await out.write_eof()
            return out

    app.cleanup_ctx.append(session_ctx)
    app.router.add_get("/v1/models", models)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


# ------------------------------------------------------------------ processes


def chart_env(tree: Path) -> tuple[dict[str, str], str]:
    """The ``LLM_SIDECAR_*`` settings the tree's chart gives the sidecar container with its
    default values (``helm template``: the tree's pinned helm, this checkout's, else one on
    the PATH), and where they came from; :data:`CHART_ENV` when there is no helm or chart."""
    chart = tree / "helm" / "llm-sidecar"
    pinned = [p for p in (tree / ".tools/bin/helm", HERE.parent / ".tools/bin/helm") if p.exists()]
    helm = str(pinned[0]) if pinned else shutil.which("helm")
    if helm is None or not chart.is_dir():
        return dict(CHART_ENV), "pinned defaults (no helm or chart to render)"
    out = subprocess.run(
        [helm, "template", "fleet", str(chart), "--set", "image.repository=example/llm-sidecar"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for doc in yaml.safe_load_all(out.stdout):
        if not doc or doc.get("kind") != "Deployment":
            continue
        spec = doc["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            if container["name"] == "llm-sidecar":
                env = {
                    e["name"]: str(e["value"])
                    for e in container.get("env", [])
                    if e["name"].startswith("LLM_SIDECAR_")
                    and "value" in e
                    and e["name"] not in ADDRESS_ENV
                }
                return env, f"{chart} rendered by {helm}"
    raise RuntimeError(f"{chart}: no llm-sidecar container in the rendered Deployment")


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs ``tree``'s ``sidecar`` package (first on the path), without the
    caller's own sidecar settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_SIDECAR_", "OTEL_"))}
    env["PYTHONPATH"] = str(tree)
    return env


async def wait_ready(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with status {proc.returncode}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(url) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready in 30 s")


# ------------------------------------------------------------------ load and recording


async def one_request(session: aiohttp.ClientSession, base: str, req: Request, tally: dict) -> None:
    headers = {"content-type": "application/json", **req.headers}
    try:
        async with session.post(base + req.path, data=req.body, headers=headers) as r:
            kind = str(r.status)
            if req.cancel_after_chunks is not None and r.status == 200:
                for _ in range(req.cancel_after_chunks):
                    if not await r.content.readany():
                        break
                r.close()  # the client leaves mid-stream
                kind = "cancelled"
            else:
                await r.read()
    except (TimeoutError, aiohttp.ClientError):
        kind = "cut"
    tally[kind] = tally.get(kind, 0) + 1


async def record_async(
    tree: Path, workdir: Path, duration: float, rate: float, every: float, seed: int
) -> dict:
    started = Processes(workdir)
    env = tree_env(tree)
    py = sys.executable
    router_runner: web.AppRunner | None = None
    try:
        sims: dict[str, int] = {}
        procs = {}
        for i, (name, _, ttft, tpot) in enumerate(MODELS):
            port = free_port()
            procs[name] = started.spawn(
                f"sim-{i}",
                [py, "-m", "sidecar", "simulate", "--listen", f"127.0.0.1:{port}", "--model", name,
                 "--ttft", str(ttft), "--tpot", str(tpot), "--seed", str(seed + i),
                 "--enable-force-include-usage"],
                tree, env,
            )  # fmt: skip
            sims[name] = port
        router_runner = web.AppRunner(
            build_router(sims), handler_cancellation=True, access_log=None
        )
        await router_runner.setup()
        site = web.TCPSite(router_runner, "127.0.0.1", 0)
        await site.start()
        router_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        proxy, admin = free_port(), free_port()
        settings, settings_from = chart_env(tree)
        sidecar = started.spawn(
            "sidecar",
            [py, "-m", "sidecar", "serve", "--upstream", f"http://127.0.0.1:{router_port}",
             "--listen", f"127.0.0.1:{proxy}", "--metrics-listen", f"127.0.0.1:{admin}"],
            tree, {**env, **settings},
        )  # fmt: skip
        timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for name, port in sims.items():
                await wait_ready(session, f"http://127.0.0.1:{port}/health", procs[name])
            await wait_ready(session, f"http://127.0.0.1:{admin}/readyz", sidecar)
            rng = random.Random(seed)
            base = f"http://127.0.0.1:{proxy}"
            metrics = f"http://127.0.0.1:{admin}/metrics"
            tally: dict[str, int] = {}
            tasks: set[asyncio.Task] = set()
            pages: list[tuple[float, str]] = []
            t0 = time.monotonic()
            next_arrival, next_page = t0, t0 + every
            while True:
                now = time.monotonic()
                if now >= next_page:
                    async with session.get(metrics) as r:
                        pages.append((now - t0, await r.text()))
                    next_page += every
                    if now - t0 >= duration:
                        break
                if now >= next_arrival and now - t0 < duration:
                    task = asyncio.create_task(one_request(session, base, draw_request(rng), tally))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    next_arrival += rng.expovariate(rate)
                    continue
                await asyncio.sleep(max(0.0, min(next_arrival, next_page) - time.monotonic()))
            # Requests still running stay open: a pod in service always has some.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if sidecar.poll() is not None:
                raise RuntimeError("the sidecar exited during the recording")
        return {
            "pages": [{"t": round(t, 3), "text": text} for t, text in pages],
            "requests": tally,
            "config": {"duration": duration, "rate": rate, "every": every, "seed": seed,
                       "tree": str(tree), "models": [m[0] for m in MODELS],
                       "sidecar_env": settings, "sidecar_env_from": settings_from},
        }  # fmt: skip
    finally:
        if router_runner is not None:
            await router_runner.cleanup()
        started.stop_all()


def record(
    tree: Path, workdir: Path, duration: float, rate: float, every: float, seed: int
) -> dict:
    """Run the mix through ``tree``'s sidecar for ``duration`` seconds; its pages over time."""
    return asyncio.run(record_async(tree, workdir, duration, rate, every, seed))
