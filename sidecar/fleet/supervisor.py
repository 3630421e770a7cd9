"""``--workers N``: N worker processes behind one proxy port, one admin port for the pod.

One sidecar process relays about 47,000 tokens/s on a core (docs/performance.md); a busy
server produces more. So N workers (:mod:`sidecar.fleet.worker`), each the single-process
sidecar with its own loop, listen on the proxy port side by side (``SO_REUSEPORT``): the
kernel spreads new connections over them by their addresses' hash. One listening socket
handed to every worker balanced far worse: a worker woken for a burst of connections accepts
them all (64 streams opened at once went 0/64, 60/4 and 26/38 over two workers; with
``SO_REUSEPORT`` 35/29, 40/24 and 34/30; docs/performance.md), and an LLM stream holds its
connection for seconds to minutes. The supervisor holds the port bound (not listening),
relays nothing, watches the workers and serves the admin port.

* ``/metrics``: the pod's one page (:mod:`sidecar.fleet.merge`), from a fresh copy of every
  worker's families taken for the scrape (the last copy where one does not answer in time),
  the totals that gone workers left, and the supervisor's own families: how many workers
  run (``llm_sidecar_workers``), how many were replaced (``llm_sidecar_worker_restarts_total``),
  and its process's figures in the pod's ``process_*``. A copy is also taken every
  ``--worker-sync-seconds``, so a worker killed without warning takes at most that much of its
  counting with it (less when the page was scraped since); a worker that exits cleanly
  leaves its final families in a file, so nothing of it is lost. No merged counter or bucket
  ever decreases.
* A worker that exits unasked is replaced (logged, counted); its requests in flight are read
  from its ledger (:mod:`sidecar.fleet.ledger`) and each is counted once, as an error.
* ``/readyz`` is 200 only when every worker runs and says it is ready; ``/healthz`` while
  the supervisor runs; ``/upstreamz`` and ``/metrics/engine`` are a worker's; ``/stallz``
  (opt-in) is the pod's one verdict from every worker's (:mod:`sidecar.fleet.stall_probe`).
* SIGTERM (or SIGINT) goes on to every worker, which drains as the single process does
  (sidecar/relay/server/drain.py); readiness is 503 from the first signal, and the admin
  port stays up until the last worker is done, so the final figures can be scraped. A second
  signal is passed on too: the workers stop draining.

The series budget (``--max-series``) is the pod's: each worker gets an equal share, so the
page, the union of the workers' series, stays within it; the page holds it too, for the
totals a replaced worker carried beside the series its replacement makes. The label admission is the pod's:
the model listing is asked once and handed to every worker; the page holds the pod's bounds
on model and tenant values (``--max-models``, ``--max-tenants``), folding a value past them
into ``other`` (:mod:`sidecar.fleet.pod_labels`); and at each sync every worker adopts the
pod's own values and gives back those the page folded. A worker that gives values back
answers with a copy of its families taken just before their series go, and the page merges
it before any later copy: what the worker counted under them since the sync's copy stays on
the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import pickle
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Metric
from prometheus_client.process_collector import ProcessCollector

from ..app import ListenError, admin_index_handler
from ..config import Settings
from ..export.families import OWN_FAMILIES, family_row
from ..export.scrape import ScrapeRenderer
from ..relay.control.model_discovery import served_models
from ..relay.control.self_loop import UpstreamLoopError, loop_reason
from ..relay.server.aiohttp_internals import GuardedServer, RebuildingRunner
from ..relay.server.client_guard import ConnectionGuard, connection_cap
from .ledger import create_ledger, read_lost
from .merge import PodPage, Source, lost_request_labels
from .stall_probe import pod_stall_probe, worker_stall_doc
from .worker import (
    FAMILIES_PATH,
    LABELS_PATH,
    MODELS_PATH,
    WorkerPlan,
    reuse_port_socket,
    spawn_args,
)

__all__ = ["Supervisor", "supervise"]

_log = structlog.get_logger("sidecar.fleet")

COPY_TIMEOUT = 2.0
"""Seconds a worker has to hand over its families before its last copy is used."""

STARTUP_TIMEOUT = 60.0
"""Seconds the supervisor waits for its workers to listen before it says it started."""

RESTART_BACKOFF = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Seconds before a worker that exited is started again, longer after each quick exit."""

_Families = list[Metric]


class _Answer(NamedTuple):
    status: int
    body: bytes
    content_type: str | None


class _Worker:
    """One worker slot: its process (replaced when it exits), its paths and its last copy."""

    def __init__(self, index: int, rundir: Path) -> None:
        self.index = index
        self.admin_path = str(rundir / f"w{index}.sock")
        self.ledger_path = str(rundir / f"w{index}.inflight")
        self.final_path = str(rundir / f"w{index}.final")
        self.proc: asyncio.subprocess.Process | None = None
        self.families: _Families = []
        self.sequence = 0
        self.listed: list[str] | None = None  # the model names it was last handed
        self.started_at = 0.0
        self.quick_exits = 0
        self.session: aiohttp.ClientSession | None = None

    def take(self, sequence: int, families: _Families) -> None:
        """A copy of the worker's families: kept only when newer than the one held (copies
        taken for a scrape and by the sync may come back in either order)."""
        if sequence > self.sequence:
            self.sequence, self.families = sequence, families

    def clear(self) -> None:
        self.families, self.sequence, self.listed = [], 0, None

    async def ask(self, path: str, json: object = None) -> _Answer | None:
        """``GET path`` on the worker's private socket (``POST`` with a ``json`` body): its
        status and body, or None when it is not running or does not answer (starting, going,
        past :data:`COPY_TIMEOUT`)."""
        if self.proc is None or self.session is None:
            return None
        method = "GET" if json is None else "POST"  # (json: the body, not the module)
        try:
            async with self.session.request(method, f"http://worker{path}", json=json) as resp:
                return _Answer(resp.status, await resp.read(), resp.headers.get("Content-Type"))
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None


class Supervisor:
    """The pod's workers and its admin app (the module doc)."""

    def __init__(self, settings: Settings, count: int, rundir: Path) -> None:
        self.count = count
        self.rundir = rundir
        # Each worker's share of the pod's series budget, so the merged page stays within it,
        # and of the connections the pod's memory holds (a cap the user set is per worker).
        self.worker_settings = settings.model_copy(
            update={
                "max_series": max(1, settings.max_series // count),
                "workers": 1,
                "max_connections": connection_cap(settings.max_connections, workers=count),
            }
        )
        self.settings = settings
        self.tenants = settings.tenant_header is not None
        self.page = PodPage(
            pod_bounds(settings),
            max_series=settings.max_series,
            idle_seconds=settings.label_idle_seconds,
        )
        self.workers = [_Worker(i, rundir) for i in range(count)]
        self.stopping = False
        self.listener: socket.socket | None = None
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        restarts = family_row(OWN_FAMILIES, "restarts").make(self.registry, False)
        running = family_row(OWN_FAMILIES, "running").make(self.registry, False)
        assert isinstance(restarts, Counter) and isinstance(running, Gauge), "the table's kinds"
        self.restarts, self.running = restarts, running
        self.renderer = ScrapeRenderer(_MergedPage(self))
        self.page_families: list[Metric] = []  # the last merge, which the renderer reads
        self._tasks: set[asyncio.Task[None]] = set()
        # Held from the copies a merge reads being taken to the merge, by a scrape and by a
        # give-back: a copy taken after a worker gave values back (their series gone) is never
        # merged before the copy that holds their final counts.
        self._merging = asyncio.Lock()
        self.models: list[str] | None = None  # what the upstream lists, asked once for the pod
        self.all_exited = asyncio.Event()

    # -- the workers ---------------------------------------------------------------------

    async def start(self, listener: socket.socket) -> None:
        self.listener = listener
        for worker in self.workers:
            await self._spawn(worker)
        self._spawn_task(self._sync())
        if not self.settings.model_allowlist:
            self._spawn_task(self._listing())

    def _spawn_task(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self, worker: _Worker) -> None:
        assert self.listener is not None
        create_ledger(worker.ledger_path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(worker.final_path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(worker.admin_path)
        plan = WorkerPlan(
            index=worker.index,
            listen_host=self.listener.getsockname()[0],
            listen_port=self.listener.getsockname()[1],
            admin_path=worker.admin_path,
            ledger_path=worker.ledger_path,
            final_path=worker.final_path,
            parent_pid=os.getpid(),
        )
        args, stdin = spawn_args(self.worker_settings, plan)
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C is the supervisor's to pass on
        )
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        await proc.stdin.drain()
        proc.stdin.close()
        worker.proc = proc
        worker.started_at = time.monotonic()
        worker.clear()
        if worker.session is None:
            worker.session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=worker.admin_path),
                timeout=aiohttp.ClientTimeout(total=COPY_TIMEOUT),
            )
        self.running.set(sum(1 for w in self.workers if w.proc is not None))
        _log.info("worker_started", worker=worker.index, pid=proc.pid)
        self._spawn_task(self._watch(worker, proc))

    async def _watch(self, worker: _Worker, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        worker.proc = None
        self.running.set(sum(1 for w in self.workers if w.proc is not None))
        lost = self._retire(worker)
        if self.stopping:
            _log.info("worker_stopped", worker=worker.index, pid=proc.pid, code=code)
            if all(w.proc is None for w in self.workers):
                self.all_exited.set()
            return
        self.restarts.inc()
        quick = time.monotonic() - worker.started_at < 10.0
        worker.quick_exits = worker.quick_exits + 1 if quick else 0
        delay = RESTART_BACKOFF[min(worker.quick_exits, len(RESTART_BACKOFF) - 1)]
        _log.warning(
            "worker_exited",
            worker=worker.index,
            pid=proc.pid,
            code=code,
            requests_lost=lost,
            restart_in=delay,
        )
        await asyncio.sleep(delay)
        if not self.stopping:
            await self._spawn(worker)

    def _retire(self, worker: _Worker) -> int:
        """The worker is gone: its final families (written as it exited cleanly) or its last
        copy go into the pod's totals, with its requests still in flight counted once."""
        try:
            with open(worker.final_path, "rb") as f:
                sequence, families = pickle.load(f)
            worker.take(sequence, families)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError):
            pass
        lost = [
            (lost_request_labels(model, route, tenant, tenants=self.tenants), float(n))
            for (model, route, tenant), n in read_lost(worker.ledger_path)
        ]
        self.page.retire(worker.index, worker.families, lost)
        worker.clear()
        return int(sum(n for _, n in lost))

    async def _copy(self, worker: _Worker) -> None:
        proc = worker.proc
        answer = await worker.ask(FAMILIES_PATH)
        if answer is None or answer.status != 200:
            return  # starting, or going: its last copy stands
        if _take_copy(worker, proc, answer.body):
            if self.models is not None and worker.listed != self.models:
                await self._hand_models(worker, self.models)  # a new worker: at once

    async def _hand_models(self, worker: _Worker, names: list[str]) -> None:
        answer = await worker.ask(MODELS_PATH, json=names)
        if answer is not None and answer.status == 204:
            worker.listed = names

    async def _listing(self) -> None:
        """Which models the upstream serves, asked once for the pod every
        ``model_refresh_seconds`` (not once a worker) and handed to every worker."""
        settings = self.settings
        async with aiohttp.ClientSession() as session:
            while not self.stopping:
                try:
                    names = await served_models(
                        session, settings.upstream, settings.readiness_timeout
                    )
                    if names is not None:
                        self.models = names
                        await asyncio.gather(*(self._hand_models(w, names) for w in self.workers))
                except Exception:  # the workers keep what they had
                    _log.exception("model_listing_failed")
                await asyncio.sleep(settings.model_refresh_seconds)

    async def listening(self, timeout: float) -> None:
        """Until every worker listens on the proxy port (its admin socket answers: it binds
        that after the proxy port), or ``timeout``: "started" means the port takes requests."""
        deadline = time.monotonic() + timeout
        waiting = list(self.workers)
        while waiting and time.monotonic() < deadline and not self.stopping:
            for worker in list(waiting):
                answer = await worker.ask("/healthz")
                if answer is not None and answer.status == 200:
                    waiting.remove(worker)
            if waiting:
                await asyncio.sleep(0.05)

    async def refresh(self) -> None:
        await asyncio.gather(*(self._copy(w) for w in self.workers))

    async def _sync(self) -> None:
        while not self.all_exited.is_set():
            await asyncio.sleep(self.settings.worker_sync_seconds)
            await self.refresh()
            await self.share_labels()

    async def share_labels(self) -> None:
        """One label admission for the pod: each worker adopts the values the page counts as
        the pod's own (what any worker admitted, within the pod's bound: a model name the
        server does not list, a tenant) and gives back those the page folds into ``other``,
        so a value is the same label on every worker within ``--worker-sync-seconds`` (a worker
        adopts within its room and its share of the series budget; a value a request holds is
        given back once it is released, at a later sync). A worker that gives values back
        answers with its families copied just before their series went, merged at once: the
        page keeps what it counted under them, also since the copy the sync took."""
        admitted: list[tuple[_Worker, dict[str, set[str]]]] = []
        for worker in self.workers:
            answer = await worker.ask(LABELS_PATH)
            if answer is None or answer.status != 200:
                continue
            try:
                doc = json.loads(answer.body)
            except ValueError:
                continue
            admitted.append((worker, {k: set(v) for k, v in doc.items()}))
        pod: dict[str, set[str]] = {}
        now = time.monotonic()
        for _, labels in admitted:
            for name, values in labels.items():
                pod.setdefault(name, set()).update(values)
                for value in sorted(values):  # the page's own, or other: decided once, here
                    self.page.labels.admit(name, value, now)
        books = self.page.labels.books
        for name, book in books.items():
            pod[name] = set(book.own)
        asks = []
        giving = False
        for worker, labels in admitted:
            missing = {k: sorted(v - labels.get(k, set())) for k, v in pod.items()}
            folded = {k: sorted(labels.get(k, set()) & book.folded) for k, book in books.items()}
            if any(missing.values()) or any(folded.values()):
                asks.append((worker, {"adopt": missing, "give_back": folded}))
                giving = giving or any(folded.values())
        if not asks:
            return
        async with self._merging:
            await asyncio.gather(*(self._hand_labels(worker, doc) for worker, doc in asks))
            if giving:
                # The given-back series at their final counts (the copies the workers answered
                # with; a worker that did not answer: its last copy), read before a later copy
                # without them, so the page carries them.
                self.merged()

    async def _hand_labels(self, worker: _Worker, doc: dict[str, dict[str, list[str]]]) -> None:
        """``POST`` the pod's labels to ``worker``; a worker that gave values back answers with
        a copy of its families taken just before their series went, which is kept."""
        proc = worker.proc
        answer = await worker.ask(LABELS_PATH, json=doc)
        if answer is not None and answer.status == 200:
            _take_copy(worker, proc, answer.body)

    def merged(self) -> list[Metric]:
        live: dict[Source, Iterable[Metric]] = {
            w.index: w.families for w in self.workers if w.families
        }
        live["supervisor"] = list(self.registry.collect())
        return self.page.merged(live)

    # -- stopping ------------------------------------------------------------------------

    def stop(self) -> None:
        """Pass SIGTERM on to every worker (they drain); again: they stop draining."""
        self.stopping = True
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signal.SIGTERM)
        if all(w.proc is None for w in self.workers):
            self.all_exited.set()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()
                await worker.proc.wait()
            if worker.session is not None:
                await worker.session.close()
        self.renderer.close()

    # -- the admin port ------------------------------------------------------------------

    async def _worker_get(self, path: str) -> web.Response:
        """A worker's own answer on ``path`` (the first one that answers)."""
        for worker in self.workers:
            answer = await worker.ask(path)
            if answer is not None:
                headers = {"Content-Type": answer.content_type} if answer.content_type else None
                return web.Response(status=answer.status, body=answer.body, headers=headers)
        return web.json_response({"reason": "no worker answers"}, status=503)

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.stopping:
            return web.json_response({"ready": False, "reason": "draining"}, status=503)
        running = [w for w in self.workers if w.proc is not None and w.session is not None]
        if len(running) < self.count:
            reason = f"{len(running)} of {self.count} workers running"
            return web.json_response({"ready": False, "reason": reason}, status=503)
        for worker in running:
            answer = await worker.ask("/readyz")
            if answer is None:
                reason = f"worker {worker.index} does not answer yet"
                return web.json_response({"ready": False, "reason": reason}, status=503)
            if answer.status != 200:
                try:
                    doc = dict(json.loads(answer.body))
                except ValueError:
                    doc = {"ready": False, "reason": f"worker {worker.index} is not ready"}
                return web.json_response({**doc, "worker": worker.index}, status=503)
        return web.json_response({"ready": True, "workers": self.count})

    async def _stallz(self, request: web.Request) -> web.Response:
        """The pod's one verdict on the engine from every worker's own (fleet/stall_probe.py)."""
        answers = await asyncio.gather(*(w.ask("/stallz") for w in self.workers))
        docs = [None if a is None else worker_stall_doc(a.body) for a in answers]
        assert self.settings.stall_probe_seconds is not None, "routed only when set"
        healthy, doc = pod_stall_probe(docs, self.settings.stall_probe_seconds)
        return web.json_response(doc, status=200 if healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        async with self._merging:
            await self.refresh()
            # Merged here, on the loop that retires workers (the renderer's thread only reads it).
            self.page_families = self.merged()
        return await self.renderer.handler(request)

    def admin_app(self) -> web.Application:
        app = web.Application()

        async def healthz(request: web.Request) -> web.Response:
            return web.json_response({"status": "alive", "workers": self.count})

        async def relayed(request: web.Request) -> web.Response:
            return await self._worker_get(request.path_qs)

        app.router.add_get("/", admin_index_handler(self.settings))
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/upstreamz", relayed)
        if self.settings.engine_metrics_path:
            app.router.add_get("/metrics/engine", relayed)
        if self.settings.stall_probe_seconds is not None:
            app.router.add_get("/stallz", self._stallz)
        return app


def _take_copy(worker: _Worker, proc: asyncio.subprocess.Process | None, body: bytes) -> bool:
    """A pickled ``(sequence, families)`` copy from ``proc`` into its worker slot, unless the
    slot's process changed meanwhile (retired, replaced); whether it was taken."""
    try:
        sequence, families = pickle.loads(body)
    except (pickle.UnpicklingError, ValueError, EOFError):
        return False
    if worker.proc is not proc:
        return False
    worker.take(sequence, families)
    return True


def pod_bounds(settings: Settings) -> dict[str, int]:
    """The pod's bound on each label's values that the page holds: ``--max-models`` and
    ``--max-tenants``, but where an allowlist names the values (a value it does not name is
    ``other`` in every worker already)."""
    bounds = {}
    if not settings.model_allowlist:
        bounds["model"] = settings.max_models
    if settings.tenant_header is not None and not settings.tenant_allowlist:
        bounds["tenant"] = settings.max_tenants
    return bounds


class AdminRunner(RebuildingRunner):
    """The pod's admin port guarded as the single process's is (``SidecarRunner``): its
    connection cap (``max_admin_connections``, a JSON 503 past it), the head budget and
    timeout, and the proxy's JSON answers to parser refusals."""

    def __init__(self, app: web.Application, settings: Settings) -> None:
        super().__init__(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        self._settings = settings

    def rebuild_server(self, built: web.Server, kwargs: dict[str, Any]) -> web.Server:
        settings = self._settings
        kwargs["keepalive_timeout"] = settings.client_header_timeout
        guard = ConnectionGuard(
            max_connections=settings.max_admin_connections,
            head_budget=settings.max_request_head_bytes,
        )
        return GuardedServer.rebuilt(built, guard, kwargs)


class _MergedPage:
    """The pod's page as the scrape renderer reads it (``collect``, and a ``name[]`` view)."""

    def __init__(self, supervisor: Supervisor, names: Sequence[str] = ()) -> None:
        self._supervisor = supervisor
        self._names = frozenset(names)

    def collect(self) -> Iterable[Metric]:
        families = self._supervisor.page_families
        if not self._names:
            return families
        return [m for m in families if any(s.name in self._names for s in m.samples)]

    def restricted_registry(self, names: Iterable[str]) -> _MergedPage:
        return _MergedPage(self._supervisor, list(names))


class RunDirectoryError(OSError):
    """No folder for the pod's workers (the CLI prints its one line)."""

    flag = "--workers"


RUN_DIRECTORY_BASES: tuple[str | None, ...] = (None, "/dev/shm")
"""Where the pod's private folder (the workers' admin sockets, ledgers, final families) may
go: the temporary directory (``TMPDIR``, else ``/tmp``), else ``/dev/shm``, a tmpfs that
Kubernetes gives every pod and keeps writable under ``readOnlyRootFilesystem`` (the chart's
setting), where ``/tmp`` is not."""


def run_directory(bases: Sequence[str | None] = RUN_DIRECTORY_BASES) -> Path:
    """The pod's private folder (mode 0700), in the first of ``bases`` that takes one."""
    tried = []
    for base in bases:
        try:
            return Path(tempfile.mkdtemp(prefix="llm-sidecar-pod-", dir=base))
        except OSError as exc:  # read-only, missing (gettempdir found nothing writable)
            tried.append(f"{base or 'TMPDIR, /tmp'}: {exc.strerror or exc}")
    raise RunDirectoryError(
        errno.EROFS,
        "--workers needs a writable folder for its workers' sockets and ledgers ("
        + "; ".join(tried)
        + "): set TMPDIR, or mount an emptyDir at /tmp",
    )


def _reserve(settings: Settings) -> socket.socket:
    """The proxy port, bound for the pod but not listening: it takes no connection itself,
    it holds the port (and learns it, for ``:0``) while workers come and go; each worker
    binds and listens beside it (:func:`~sidecar.fleet.worker.reuse_port_socket`)."""
    host, port = settings.listen_addr
    try:
        return reuse_port_socket(host, port)
    except OSError as exc:
        raise ListenError("--listen", settings.listen, exc) from exc


async def supervise(settings: Settings, count: int, stop: asyncio.Event | None = None) -> None:
    """Run ``count`` workers until SIGTERM/SIGINT (or ``stop``), then drain them and return."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        if signals > 1:  # a second signal: the workers stop draining too
            supervisor.stop()

    rundir = run_directory()
    try:
        listener = _reserve(settings)
    except OSError:
        shutil.rmtree(rundir, ignore_errors=True)
        raise
    supervisor = Supervisor(settings, count, rundir)
    admin = AdminRunner(supervisor.admin_app(), settings)
    try:
        if looping := await loop_reason(settings.upstream, [listener.getsockname()]):
            raise UpstreamLoopError(looping)
        await admin.setup()
        mhost, mport = settings.metrics_addr
        try:
            await web.TCPSite(admin, mhost, mport).start()
        except OSError as exc:
            raise ListenError("--metrics-listen", settings.metrics_listen, exc) from exc
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)
        await supervisor.start(listener)
        await supervisor.listening(timeout=STARTUP_TIMEOUT)
        _log.info(
            "started",
            workers=count,
            listen=settings.listen,
            metrics_listen=settings.metrics_listen,
            bound=[_address(listener.getsockname())],
            metrics_bound=[_address(a) for a in admin.addresses],
            upstream=settings.upstream,
        )
        await stop.wait()
        supervisor.stop()
        await supervisor.all_exited.wait()
        _log.info("stopped", workers=count)
    finally:
        await supervisor.close()
        await admin.cleanup()
        listener.close()
        shutil.rmtree(rundir, ignore_errors=True)


def _address(address: tuple[object, ...]) -> str:
    host, port = str(address[0]), address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
