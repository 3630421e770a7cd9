"""Wiring: settings -> the proxy app and the admin app, their lifecycle, and ``serve``.

Two aiohttp applications on two ports, so the proxy port stays a pure pass-through (an
upstream's own ``/metrics`` or ``/health`` still answer through it) and the sidecar's own
endpoints can be bound to a different interface.

Requests aiohttp's parser refuses (oversized request line or header, too many headers,
smuggling attempts such as ``Content-Length`` with ``Transfer-Encoding``, duplicated
``Content-Length``, malformed framing) never reach a handler or the upstream. aiohttp
answers them with a text 400 that quotes up to 100 raw bytes of the request (a huge
``Authorization`` value, for instance) and logs the same bytes with a traceback; its error
path bypasses middlewares, so :class:`SidecarRunner` swaps in a connection handler that
answers 414/431/400 with the proxy's JSON error body and logs one line naming the cause,
never the bytes. ``serve`` uses it for both ports.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows
    resource = None  # type: ignore[assignment]  # no module there: None guards its use

import aiohttp
import orjson
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

from . import __version__
from .base.prompt_class import PromptClasses
from .base.speedups import IN_C, SPEEDUPS_MISSING
from .base.tenant import TenantLabeler
from .config import Settings
from .export.capacity import CapacityMetrics
from .export.in_flight import InFlightView, StallWatch, stall_probe
from .export.logs import RequestLogger
from .export.metrics import SidecarMetrics, SLOThresholds
from .export.otel_setup import TelemetryProviders, providers_from_env
from .export.otel_stalls import register_stall_gauge
from .export.prometheus_internals import WithoutCreated
from .export.scrape import ScrapeRenderer
from .export.spans import RequestTelemetry
from .measure.objectives import ObjectiveDefaults
from .measure.record import InFlightLedger, RecordBook, RequestRecord
from .relay.control.bounded_read import read_bounded
from .relay.control.engine_metrics import engine_metrics_handler
from .relay.control.model_discovery import served_models
from .relay.control.self_loop import (
    LOOP_HEADER,
    LOOP_STATUS,
    LOOP_TOKEN,
    UpstreamLoopError,
    came_back,
    loop_reason,
    loop_refusal,
)
from .relay.control.upstream_watch import UpstreamWatch, describe_failure, watch
from .relay.data.body_budget import BodyBudget
from .relay.data.exchange import Carrier
from .relay.data.limits import RelayLimits
from .relay.data.upstream import UpstreamPool
from .relay.server.aiohttp_internals import (
    GuardedServer,
    RebuildingRunner,
)
from .relay.server.client_guard import ConnectionGuard, connection_cap
from .relay.server.drain import Drain, needs_full_drain
from .relay.server.proxy_port import ProxyPort

__all__ = [
    "ProxyRunner",
    "Sidecar",
    "SidecarRunner",
    "bind_sites",
    "build_sidecar",
    "serve",
    "setup_runners",
    "SIDECAR",
]

_log = structlog.get_logger("sidecar.app")


class UpstreamLink:
    """The sidecar's connections to the upstream, which exist while the proxy app runs: the
    relay's ``pool``, and the ``session`` of its own requests (readiness probes, model
    listings, engine metrics). Both need the running loop, so the proxy app opens them as it
    starts (:meth:`open`) and closes them as it stops; the relay asks :meth:`get_pool`."""

    __slots__ = ("session", "pool")

    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None
        self.pool: UpstreamPool | None = None

    def open(self, settings: Settings) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers=OWN_REQUEST_HEADERS,
        )
        self.pool = UpstreamPool(
            settings.upstream,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
        )

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        if self.session is not None:
            await self.session.close()

    def get_pool(self) -> UpstreamPool:
        assert self.pool is not None, "the proxy app has not started"
        return self.pool


@dataclass
class Sidecar:
    """The running parts, shared by both apps through ``app[SIDECAR]``. The drain and both
    apps are made from the rest as the Sidecar is (``__post_init__``); the upstream
    connections (``link``) exist while the proxy app runs."""

    settings: Settings
    registry: CollectorRegistry
    metrics: SidecarMetrics
    proxy: Carrier  # the relay: every request on the proxy port
    renderer: ScrapeRenderer
    tenants: TenantLabeler | None = None
    capacity: CapacityMetrics | None = None
    link: UpstreamLink = field(default_factory=UpstreamLink)
    drain: Drain = field(init=False)
    watch: UpstreamWatch = field(default_factory=UpstreamWatch)  # logs each change of its state
    admin_app: web.Application = field(init=False)
    # Asks the upstream which models it serves (a pod's supervisor does, for its workers).
    lists_models: bool = True
    in_flight: InFlightView | None = None  # the requests in flight, read when asked
    stall_watch: StallWatch | None = None  # tracing on: marks where stalled streams stopped

    def __post_init__(self) -> None:
        proxy = self.proxy
        self.drain = Drain(self.upstream_up, lambda: proxy.records.in_flight)
        proxy.drain = self.drain
        self.admin_app = _admin_app(self)

    @property
    def draining(self) -> bool:
        return self.drain.draining

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The session of the sidecar's own requests (None until the proxy app starts)."""
        return self.link.session

    @property
    def pool(self) -> UpstreamPool | None:
        """The relay's connections (None until the proxy app starts)."""
        return self.link.pool

    async def upstream_status(self, session: aiohttp.ClientSession | None = None) -> int:
        """The status of one GET of the upstream's health path (raises when unreachable).

        A pooled keep-alive connection the server closed as it was reused (a server going
        away closes its idle connections first) says nothing about the server: the probe is
        asked once more on a new connection, as the relay's pool does, so the reason given is
        the server's state ("connection refused"), not "Cannot write to closing transport"."""
        session = session or self.session
        if session is None:
            raise aiohttp.ClientConnectionError("the proxy app has not started")
        try:
            return await self._health_get(session)
        except aiohttp.ClientConnectionError as exc:
            if getattr(exc, "os_error", None) is not None or isinstance(exc, asyncio.TimeoutError):
                raise  # a new connection failed, or the server did not answer in time
        async with self._fresh_session() as fresh:
            return await self._health_get(fresh)

    async def _health_get(self, session: aiohttp.ClientSession) -> int:
        url = self.settings.upstream + self.settings.health_path
        timeout = aiohttp.ClientTimeout(total=self.settings.readiness_timeout)
        async with session.get(url, timeout=timeout) as resp:
            if await read_bounded(resp.content, HEALTH_BODY_BYTES) is None:
                resp.close()  # the rest is left unread: the connection is not reused
            return resp.status

    @staticmethod
    def _fresh_session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            cookie_jar=aiohttp.DummyCookieJar(),
            headers=OWN_REQUEST_HEADERS,
        )

    async def upstream_up(self) -> bool:
        """For the drain: does the upstream still accept a NEW connection? (A server that is
        stopping closes its listener first; a pooled keep-alive connection could still
        answer and hide that.)"""
        async with self._fresh_session() as fresh:
            return 200 <= await self.upstream_status(fresh) < 300

    def get_pool(self) -> UpstreamPool:
        return self.link.get_pool()


HEALTH_BODY_BYTES = 64 << 10
"""The most of a health answer's body the probe reads: its status is the answer, and a
server that sends more (a misrouted path, a hostile upstream) must not fill the memory."""

SIDECAR: web.AppKey[Sidecar] = web.AppKey("sidecar", Sidecar)

# LOOP_HEADER: a probe that comes back to this sidecar is answered 508 (relay/control/self_loop.py).
OWN_REQUEST_HEADERS = {"User-Agent": "llm-sidecar", LOOP_HEADER: LOOP_TOKEN}
"""On the sidecar's own requests to the upstream (health probes, the upstream watch, engine
metrics; the model listing adds what it is), so the server's access log, and a test, can
tell them from the clients' requests it relays, which keep the client's User-Agent."""


class _RunnerOptions(TypedDict):
    """What every runner of the sidecar is made with."""

    handler_cancellation: bool
    access_log: None


# aiohttp's own per-request access log would duplicate ours and log raw paths (queries).
RUNNER_KWARGS: _RunnerOptions = {"handler_cancellation": True, "access_log": None}


def objective_defaults(settings: Settings) -> ObjectiveDefaults:
    """The objectives of a request without x-slo-* headers: the model's
    (``slo_model_objectives``), else the goodput objectives (sidecar/measure/objectives.py)."""
    return ObjectiveDefaults(
        settings.slo_ttft_seconds,
        settings.slo_tpot_seconds,
        {
            model: (o.ttft_seconds, o.tpot_seconds)
            for model, o in settings.slo_model_objectives.items()
        },
    )


def build_sidecar(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    access_log: bool | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    providers: TelemetryProviders | None = None,
    ledger: InFlightLedger | None = None,
) -> Sidecar:
    """Wire the parts. OpenTelemetry is on only for the providers passed in (``serve`` builds
    them from ``OTEL_*`` and passes ``providers``; tests pass in-memory ones); with neither,
    the proxy has no tracer. Every family the page will have is registered here, before the
    series gate is set up (a family registered later would be counted but never gated)."""
    registry = registry if registry is not None else CollectorRegistry()
    if providers is not None:
        tracer_provider = (
            tracer_provider if tracer_provider is not None else providers.tracer_provider
        )
        meter_provider = meter_provider if meter_provider is not None else providers.meter_provider
        providers.register(registry)  # llm_sidecar_otlp_export_failures_total, with OTLP on
    # The Prometheus page: its families (the capacity curve's too), its one series budget
    # and the model label, which reports to them (SidecarMetrics).
    metrics = SidecarMetrics(
        registry,
        SLOThresholds(
            settings.slo_ttft_seconds, settings.slo_tpot_seconds, settings.slo_e2e_seconds
        ),
        PromptClasses(settings.ttft_prompt_classes),
        tenants=settings.tenant_header is not None,
        model_allowlist=settings.model_allowlist,
        max_models=settings.max_models,
        label_idle_seconds=settings.label_idle_seconds,
        max_series=settings.max_series,
        capacity=True,
    )
    capacity, gate = metrics.capacity, metrics.gate
    assert capacity is not None and gate is not None
    recorders = [metrics.record, capacity.record]
    telemetry: RequestTelemetry | None = None
    if tracer_provider is not None or meter_provider is not None:
        try:
            telemetry = RequestTelemetry(
                settings.upstream,
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                model_label=metrics.model_label,
                provider_name=settings.otel_provider_name,
            )
            # First: the span ends (and OTel metrics record) before the Prometheus observation.
            recorders.insert(0, telemetry.record)
        except Exception:  # telemetry never stops the proxy
            _log.exception("otel_setup_failed")
    if settings.access_log if access_log is None else access_log:
        recorders.append(RequestLogger())
    tenants = None
    if settings.tenant_header is not None:
        tenants = TenantLabeler(
            settings.tenant_header,
            settings.tenant_allowlist,
            settings.max_tenants,
            idle_seconds=settings.label_idle_seconds,
            budget=metrics.budget,
            on_overflow=metrics.overflow_counter("tenant"),
            on_forget=lambda value: metrics.forget("tenant", value),
        )
    link = UpstreamLink()  # the relay's pool, made when the proxy app starts
    records = RecordBook(
        metrics.model_label,
        on_start=metrics.started,
        on_end=metrics.ended,
        recorders=recorders,
        tracer=telemetry if telemetry is not None and telemetry.tracing else None,
        tenant_label=tenants,
        decode_tracker=capacity.trackers,
        ledger=ledger,
        max_json_bytes=settings.max_response_inspect_bytes,
        max_line_bytes=settings.max_sse_line_bytes,
        objectives=objective_defaults(settings),
    )
    proxy = Carrier(
        records,
        link.get_pool,
        RelayLimits(
            max_request_inspect_bytes=settings.max_request_inspect_bytes,
            max_request_body_bytes=settings.max_request_body_bytes,
            client_body_timeout=settings.client_body_timeout,
            send_timeout=settings.send_timeout,
            max_response_inspect_bytes=settings.max_response_inspect_bytes,
            max_line_bytes=settings.max_sse_line_bytes,
        ),
        BodyBudget(settings.max_buffered_request_bytes),
        refused=lambda headers: loop_refusal() if came_back(headers) else None,
    )
    # The page without prometheus_client's _created samples (for this registry only; its
    # process-wide switch would change every registry in the process).
    renderer = ScrapeRenderer(WithoutCreated(registry))
    # The requests in flight, read at scrape time: no series while none is, and at most
    # three phases of the (model, route) values in flight, which the budget bounds already.
    in_flight = InFlightView(records, settings.stall_seconds)
    registry.register(in_flight)
    # One series budget for the whole page, counted before any series is made: every
    # family registered by now (whoever added it; nothing is registered after this) is
    # checked at child creation, and label admission asks the same count what a new value
    # would cost (metrics.budget).
    gate.guard()
    stall_watch = None
    if telemetry is not None:
        if telemetry.metrics and meter_provider is not None:
            try:  # the OTel twin of llm_streams_stalled
                register_stall_gauge(meter_provider, in_flight)
            except Exception:  # telemetry never stops the proxy
                _log.exception("otel_setup_failed")
        if telemetry.tracing:  # a span event where each stalled stream stopped
            stall_watch = StallWatch(in_flight, _stall_event(telemetry, settings.stall_seconds))
    return Sidecar(
        settings, registry, metrics, proxy, renderer, tenants=tenants, capacity=capacity, link=link,
        in_flight=in_flight, stall_watch=stall_watch,
    )  # fmt: skip


def _stall_event(
    telemetry: RequestTelemetry, threshold: float
) -> Callable[[RequestRecord, float, str], None]:
    def stalled(record: RequestRecord, since: float, phase: str) -> None:
        telemetry.stalled(record.timeline, since, phase, threshold)

    return stalled


class ProxyRunner:
    """The proxy port as ``serve`` runs it (sidecar/relay/server/proxy_port.py): every request
    answered by the relay (``sc.proxy``) from the connection's callbacks, whatever its target,
    with aiohttp's parser and the settings' limits (parser limits, connection cap, head
    budget, header timeout); and, from :meth:`setup` to :meth:`cleanup`, the upstream
    connections and the label refresh. :meth:`cleanup` is the drain's last wait: at most
    ``shutdown_timeout`` seconds for what is still being answered."""

    def __init__(self, sc: Sidecar, *, shutdown_timeout: float) -> None:
        settings = sc.settings
        self.sc = sc
        self.shutdown_timeout = shutdown_timeout
        self.guard = ConnectionGuard(
            max_connections=connection_cap(settings.max_connections),
            head_budget=settings.max_request_head_bytes,
            carry=sc.proxy,
        )
        self.port = ProxyPort(
            self.guard,
            header_timeout=settings.client_header_timeout,
            max_line_size=settings.max_request_line_bytes,
            max_field_size=settings.max_header_field_bytes,
            max_headers=settings.max_request_headers,
        )
        self._refresh: asyncio.Future[None] | None = None
        self._stall_watch: asyncio.Future[None] | None = None

    @property
    def addresses(self) -> list[Any]:
        return self.port.addresses

    async def setup(self) -> None:
        self.sc.link.open(self.sc.settings)
        self._refresh = asyncio.ensure_future(_refresh_labels(self.sc))
        if self.sc.stall_watch is not None:
            self._stall_watch = asyncio.ensure_future(self.sc.stall_watch.run())

    async def listen(self, host: str, port: int) -> None:
        await self.port.listen(host, port)

    async def cleanup(self) -> None:
        await self.port.shutdown(self.shutdown_timeout)
        if self._refresh is not None:
            self._refresh.cancel()
        if self._stall_watch is not None:
            self._stall_watch.cancel()
        await self.sc.link.close()
        self.sc.renderer.close()


async def _refresh_labels(sc: Sidecar) -> None:
    """In the background, never on a request's path: learn the models the upstream serves
    (the ``model`` label admits only those, sidecar/base/labels.py) and forget label values
    idle too long."""
    labeler = sc.metrics.model_label
    while True:
        try:
            if sc.lists_models and sc.session is not None and not sc.settings.model_allowlist:
                names = await served_models(
                    sc.session, sc.settings.upstream, sc.settings.readiness_timeout
                )
                if names is not None:
                    labeler.vouch(names)
            labeler.expire()
            if sc.tenants is not None:
                sc.tenants.bound.expire()
        except asyncio.CancelledError:
            raise
        except Exception:  # measuring never stops the proxy
            _log.exception("label_refresh_failed")
        await asyncio.sleep(sc.settings.model_refresh_seconds)


ADMIN_ENDPOINTS: tuple[tuple[str, str], ...] = (
    ("/metrics", "the request metrics, Prometheus text (OpenMetrics when asked)"),
    ("/healthz", "200 while the process runs (liveness)"),
    ("/readyz", "200 when the upstream's health path answers 2xx, else 503 and why (readiness)"),
    ("/upstreamz", "the upstream's health alone: 200 or 503 and why, 200 also while draining"),
    ("/metrics/engine", "the upstream's own metrics page, relayed (--engine-metrics-path)"),
    ("/stallz", "503 when the streams in flight stalled and none completed (opt-in, liveness)"),
)
"""The admin port's endpoints and one line on each, as its ``/`` lists them."""


def admin_index(endpoints: Sequence[tuple[str, str]]) -> str:
    """The admin port's ``/``: one line per endpoint, plain text."""
    width = max(len(path) for path, _ in endpoints)
    lines = [f"llm-sidecar {__version__} admin port"]
    lines += [f"{path.ljust(width)}  {what}" for path, what in endpoints]
    return "\n".join(lines) + "\n"


def admin_index_handler(settings: Settings) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The admin port's ``/``, what a person opening it in a browser looks for: its
    endpoints (``/metrics/engine`` only where it is relayed)."""
    endpoints = list(ADMIN_ENDPOINTS)
    if not settings.engine_metrics_path:
        endpoints = [e for e in endpoints if e[0] != "/metrics/engine"]
    if settings.stall_probe_seconds is None:
        endpoints = [e for e in endpoints if e[0] != "/stallz"]
    index_text = admin_index(endpoints)

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=index_text, content_type="text/plain")

    return index


def _admin_app(sc: Sidecar) -> web.Application:
    app = web.Application()
    app[SIDECAR] = sc

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(request: web.Request) -> web.Response:
        if sc.draining:
            return _json(503, {"ready": False, "reason": "draining"})
        if sc.session is None:
            return _json(503, {"ready": False, "reason": "starting"})
        return await _upstream_health(sc, "ready")

    async def upstreamz(request: web.Request) -> web.Response:
        """The upstream's health for a probe of the model server's container (the kubelet
        cannot reach a loopback server): unlike /readyz, it does not turn 503 on draining,
        so a liveness probe never restarts a server that is finishing its streams."""
        return await _upstream_health(sc, "alive")

    app.router.add_get("/", admin_index_handler(sc.settings))
    app.router.add_get("/metrics", sc.renderer.handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/upstreamz", upstreamz)
    if sc.settings.stall_probe_seconds is not None and sc.in_flight is not None:
        app.router.add_get("/stallz", stallz_handler(sc.in_flight, sc.settings.stall_probe_seconds))
    if sc.settings.engine_metrics_path:
        app.router.add_get(
            "/metrics/engine",
            engine_metrics_handler(
                lambda: sc.session,
                sc.settings.upstream + sc.settings.engine_metrics_path,
                sc.settings.engine_metrics_timeout,
            ),
        )
    return app


def stallz_handler(
    view: InFlightView, probe_seconds: float
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``/stallz``, opt-in: a liveness probe for the model server's container that fails only
    on a hung engine (sidecar/export/in_flight.py, ``stall_probe``), never on load or idleness.
    Readiness (/readyz) does not read it."""

    async def stallz(request: web.Request) -> web.Response:
        healthy, doc = stall_probe(view, probe_seconds)
        return _json(200 if healthy else 503, doc)

    return stallz


async def _upstream_health(sc: Sidecar, key: str) -> web.Response:
    """200 ``{key: true}`` when the upstream's health path answers 2xx, else 503 and why."""
    try:
        status = await sc.upstream_status()
    except (TimeoutError, aiohttp.ClientError) as exc:
        reason = describe_failure(exc, sc.settings.upstream)  # the words of the proxy's 502s
        sc.watch.report(False, reason)
        return _json(503, {key: False, "reason": reason})
    if 200 <= status < 300:
        sc.watch.report(True)
        return _json(200, {key: True, "upstream_status": status})
    reason = f"the inference server is not healthy: {sc.settings.health_path} answered {status}"
    if status == LOOP_STATUS:  # our own probe came back to us, or the server says so (RFC 5842)
        reason = f"the upstream relays back to this sidecar (a loop): {sc.settings.upstream}; give the inference server's address"
    sc.watch.report(False, reason)
    return _json(503, {key: False, "reason": reason, "upstream_status": status})


def _json(status: int, doc: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(doc), content_type="application/json")


class SidecarRunner(RebuildingRunner):
    """``web.AppRunner`` (the admin port's) whose connections are guarded
    (sidecar/relay/server/client_guard.py): parser refusals answered with the sidecar's JSON
    error body, a connection cap and a request head budget. aiohttp has no public hook for this (its error path runs no middleware),
    so the server aiohttp builds is rebuilt around
    :class:`~sidecar.relay.server.aiohttp_internals.GuardedRequestHandler` with the same arguments;
    tests over real sockets pin the result."""

    def rebuild_server(self, built: web.Server, kwargs: dict[str, Any]) -> web.Server:
        sc = self.app.get(SIDECAR) if isinstance(self.app, web.Application) else None
        if sc is not None:
            # aiohttp's keep-alive timer starts when a connection opens and again after each
            # response, and closes the connection if no complete request head arrived by
            # then: that is nginx's client_header_timeout (and keepalive_timeout). Left to
            # itself, AppRunner's handler waits 3,630 s, so a head sent a byte at a time
            # (or nothing at all) held a connection for an hour.
            kwargs["keepalive_timeout"] = sc.settings.client_header_timeout
        guard = ConnectionGuard()
        if sc is not None:  # the admin port: within connection_cap's reserve of 128
            max_connections = sc.settings.max_admin_connections if self.app is sc.admin_app else 0
            guard = ConnectionGuard(
                max_connections=max_connections, head_budget=sc.settings.max_request_head_bytes
            )
        return GuardedServer.rebuilt(built, guard, kwargs)


def raise_open_file_limit() -> int | None:
    """Raise the soft limit on open files to the hard limit and return it (None if unknown).

    Every stream holds two sockets (client and upstream), so the common soft default of
    1024 would cap a sidecar at about 500 concurrent streams while the hard limit allows far
    more. Go's runtime does the same at start.
    """
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


class ListenError(OSError):
    """A port could not be bound; ``flag`` names the setting that chose it."""

    def __init__(self, flag: str, address: str, exc: OSError) -> None:
        super().__init__(exc.errno, f"cannot listen on {address} ({flag}): {exc.strerror or exc}")
        self.flag = flag


def bound_addresses(runner: web.BaseRunner | ProxyRunner) -> list[str]:
    """The ``host:port`` pairs ``runner`` listens on (one per socket; IPv6 hosts bracketed)."""
    out = []
    for address in runner.addresses:
        if isinstance(address, str):  # a Unix socket's path (a pod worker's admin app)
            out.append(address)
            continue
        host, port = address[:2]
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return out


async def _bind(listening: Awaitable[None], flag: str, address: str) -> None:
    try:
        await listening
    except OSError as exc:
        raise ListenError(flag, address, exc) from exc


async def setup_runners(sc: Sidecar) -> tuple[ProxyRunner, SidecarRunner]:
    """The proxy's and the admin app's runners, set up but not yet listening: what ``serve``
    runs, and what the tests' in-process sidecar runs (tests/support/in_process.py), so the server the
    tests exercise (the proxy port's connections, connection caps, head budget, the relay) is this one."""
    proxy_runner = ProxyRunner(sc, shutdown_timeout=sc.settings.drain_seconds)
    admin_runner = SidecarRunner(sc.admin_app, shutdown_timeout=1.0, **RUNNER_KWARGS)
    await proxy_runner.setup()
    await admin_runner.setup()
    return proxy_runner, admin_runner


async def bind_sites(sc: Sidecar, proxy_runner: ProxyRunner, admin_runner: SidecarRunner) -> None:
    """Listen on ``--listen`` (proxy) and ``--metrics-listen`` (admin); :class:`ListenError`
    names the flag of a port that cannot be bound."""
    settings = sc.settings
    host, port = settings.listen_addr
    await _bind(proxy_runner.listen(host, port), "--listen", settings.listen)
    mhost, mport = settings.metrics_addr
    await _bind(
        web.TCPSite(admin_runner, mhost, mport).start(), "--metrics-listen", settings.metrics_listen
    )


async def _until_forced(drain: Awaitable[None], force: asyncio.Event) -> None:
    """Run the drain until it ends or a second signal sets ``force``."""
    task = asyncio.ensure_future(drain)
    forced = asyncio.ensure_future(force.wait())
    try:
        await asyncio.wait({task, forced}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, forced):
            t.cancel()


@dataclass(frozen=True)
class PodWorker:
    """How :func:`serve` runs as one of a pod's workers (sidecar/fleet/worker.py): ``bind``
    listens on the proxy port beside the other workers, and the admin app on the worker's
    private socket; the routes its supervisor reads added to the admin app
    (``admin_routes``), its requests in flight kept in ``ledger``, its final figures handed
    on once its last request is done (``stopped``), and stopping (draining) when its
    supervisor, ``parent_pid``, is gone."""

    index: int
    bind: Callable[[Sidecar, ProxyRunner, SidecarRunner], Awaitable[None]]
    admin_routes: Callable[[Sidecar], None]
    stopped: Callable[[Sidecar], None]
    ledger: InFlightLedger
    parent_pid: int


async def _orphaned(parent_pid: int, stop: asyncio.Event) -> None:
    """A worker whose supervisor died (``kill -9``: it cannot pass on a signal) drains and
    stops, rather than serve on unwatched."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(1.0)
    _log.warning("supervisor_gone", parent_pid=parent_pid)
    stop.set()


async def serve(
    settings: Settings, stop: asyncio.Event | None = None, *, worker: PodWorker | None = None
) -> None:
    """Run until SIGTERM/SIGINT (or ``stop``), then drain and return.

    Shutdown order (:mod:`sidecar.relay.server.drain`): readiness goes 503 and the proxy keeps relaying
    while the upstream answers; once it is gone new requests get 503 + Retry-After and
    in-flight ones finish, all within ``drain_seconds`` (what is left then is cut); the
    admin port closes last so the final figures can still be scraped during the drain.
    """
    open_files = raise_open_file_limit()
    providers = providers_from_env(metrics=settings.otel_metrics)
    sc = build_sidecar(
        settings, providers=providers, ledger=worker.ledger if worker is not None else None
    )
    if worker is not None:
        sc.lists_models = False  # the supervisor asks once for the pod and hands the names on
        worker.admin_routes(sc)
    # Tail latency: the start-up objects never die, so keep them out of every collection,
    # and collect the young generation less often (the benchmark saw 14-39 ms gen1/gen2
    # pauses at 600 streams; with this, gen1 pauses stayed under 1 ms).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 50, 100)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    force = asyncio.Event()  # a second SIGTERM/SIGINT: stop draining, exit now

    def on_signal() -> None:
        if stop.is_set():
            if not force.is_set():
                _log.warning("forced_exit", in_flight=sc.proxy.records.in_flight)
            force.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-main thread
            pass
    proxy_runner, admin_runner = await setup_runners(sc)
    started = False  # a bind failure (port taken) is reported by the CLI alone, no "stopped" line
    try:
        await (worker.bind if worker is not None else bind_sites)(sc, proxy_runner, admin_runner)
        if looping := await loop_reason(settings.upstream, proxy_runner.addresses):
            raise UpstreamLoopError(looping)  # one line from the CLI, before "started"
        _log.info(
            "started",
            listen=settings.listen,
            metrics_listen=settings.metrics_listen,
            # What was bound: with port 0 the kernel picks one, and this is how a caller learns it.
            bound=bound_addresses(proxy_runner),
            metrics_bound=bound_addresses(admin_runner),
            upstream=settings.upstream,
            open_files_limit=open_files,
            speedups="on" if IN_C else "off",
            **({"worker": worker.index} if worker is not None else {}),
        )
        if (
            not IN_C
        ):  # says so once, where an operator reads: ~2x the CPU per token otherwise unexplained
            _log.warning("speedups_missing", reason=SPEEDUPS_MISSING)
        started = True
        watcher = asyncio.create_task(watch(lambda: _upstream_health(sc, "ready")))
        orphaned = (
            asyncio.create_task(_orphaned(worker.parent_pid, stop)) if worker is not None else None
        )
        await stop.wait()
        # Idle, not in a pod: nothing to wait for.
        if not needs_full_drain(sc.proxy.records.in_flight):
            _log.info("stopping", in_flight=0)
            proxy_runner.shutdown_timeout = 0.1
        else:
            drain_started = loop.time()  # the drain logs what it waits for (``draining``)
            await _until_forced(sc.drain.run(settings.drain_seconds), force)
            # What is still in flight at the deadline gets no more time than is left; nothing
            # after a second signal (it is cut, and recorded as cancelled).
            left = 0.0 if force.is_set() else settings.drain_seconds - (loop.time() - drain_started)
            proxy_runner.shutdown_timeout = max(0.0, left)
    finally:
        if started:
            watcher.cancel()
            if orphaned is not None:
                orphaned.cancel()
        await proxy_runner.cleanup()
        if worker is not None and started:
            worker.stopped(sc)  # every request's record is closed: its final figures
        await admin_runner.cleanup()
        if providers.enabled:  # flush the spans and metrics of the drained requests
            await asyncio.to_thread(providers.shutdown)
        if started:
            _log.info("stopped")
