"""One of a pod's workers: the sidecar's own ``serve``, listening on the proxy port beside
the pod's other workers (``SO_REUSEPORT``), with its admin app on a private Unix socket that
only the supervisor reads (``python -m sidecar.fleet.worker``, its plan on stdin:
:func:`spawn_args`).

The worker is the single-process sidecar in every way that touches a request: the same
relay, records and registry (exemplars, process metrics). What it adds is for its supervisor
(:mod:`sidecar.fleet.supervisor`):

* ``GET /pod/families`` on the private socket: what its registry's ``collect()`` yields,
  pickled, with a sequence number, so the supervisor keeps only the newest copy;
* ``POST /pod/models``: the model names the upstream lists, which the supervisor asks for
  once for the pod (not once a worker) and hands to every worker;
* ``GET``/``POST /pod/labels``: the model and tenant label values it admitted; those the pod
  counts as its own, which it adopts, and those the pod's page folds into ``other``, which it
  gives back (one admission for the pod, within a sync), answering with a copy of its
  families taken just before their series go, so their final counts reach the page;
* its requests in flight in a :class:`~sidecar.fleet.ledger.InFlightLedger`, which the
  supervisor reads if the worker dies;
* stopping (draining) when the supervisor is gone;
* OpenTelemetry under the pod's resource with a ``service.instance.id`` of its own
  (:func:`worker_resource`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pickle
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from urllib.parse import quote

from aiohttp import web
from opentelemetry.sdk.environment_variables import OTEL_RESOURCE_ATTRIBUTES

from ..app import PodWorker, ProxyRunner, Sidecar, SidecarRunner, serve
from ..base.labels import BoundedLabel
from ..config import Settings
from ..export import semconv
from ..export.logs import configure_logging
from ..export.otel_env import resource_attributes
from .ledger import InFlightLedger
from .process import prepare_process

__all__ = ["FAMILIES_PATH", "LABELS_PATH", "MODELS_PATH", "WorkerPlan", "main", "spawn_args"]

FAMILIES_PATH = "/pod/families"
MODELS_PATH = "/pod/models"
LABELS_PATH = "/pod/labels"


@dataclass(frozen=True)
class WorkerPlan:
    """What a worker is told on stdin: its index, the proxy port's address, its admin
    socket's, ledger's and final families' paths, its supervisor's pid."""

    index: int
    listen_host: str
    listen_port: int
    admin_path: str
    ledger_path: str
    final_path: str
    parent_pid: int


def spawn_args(settings: Settings, plan: WorkerPlan) -> tuple[list[str], bytes]:
    """The command that starts a worker and what to write to its stdin."""
    doc = {"settings": settings.model_dump(mode="json"), "plan": asdict(plan)}
    return [sys.executable, "-m", "sidecar.fleet.worker"], json.dumps(doc).encode()


class _Families:
    """The worker's families for its supervisor: ``GET /pod/families`` answers
    ``(sequence, families)`` pickled, collected off the loop (one thread: copies leave in the
    order they were collected, and the sequence says so); a copy that answers a give-back is
    collected on the loop's thread and numbered from the same sequence; :meth:`final` writes
    the last copy to ``final_path`` once every request is done (written whole, then
    renamed)."""

    def __init__(self, final_path: str) -> None:
        self._numbers = itertools.count(1)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pod-families")
        self._final_path = final_path

    def _collect(self, sc: Sidecar) -> bytes:
        return pickle.dumps((next(self._numbers), list(sc.registry.collect())), protocol=5)

    def route(self, sc: Sidecar) -> None:
        async def families(request: web.Request) -> web.Response:
            body = await asyncio.get_running_loop().run_in_executor(self._pool, self._collect, sc)
            return web.Response(body=body, content_type="application/octet-stream")

        async def models(request: web.Request) -> web.Response:
            names = await request.json()
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                sc.metrics.model_label.vouch(names)
                return web.Response(status=204)
            return web.Response(status=400)

        def labelers() -> dict[str, BoundedLabel]:
            found: dict[str, BoundedLabel] = {"model": sc.metrics.model_label}
            if sc.tenants is not None:
                found["tenant"] = sc.tenants.bound
            return found

        async def labels(request: web.Request) -> web.Response:
            """GET: the label values this worker admitted; POST: ``give_back``, the values the
            pod folds into ``other`` (first, so their slots are free), and ``adopt``, the
            pod's own values.

            A value given back takes its series with it, and what they counted since the
            supervisor's last copy would go too. So when something goes, the answer is a copy
            of the families (as ``GET /pod/families`` answers) collected just before, in the
            same synchronous step on the loop's thread, the one writer of the counts: no
            request is counted between the copy and the removal, and the page carries the
            series' final values. Nothing given back: 204, nothing collected."""
            if request.method == "GET":
                return web.json_response({k: sorted(b.values) for k, b in labelers().items()})
            doc = await request.json()
            if not isinstance(doc, dict):
                return web.Response(status=400)
            found = labelers()
            going = {k: b.returnable(_strings(doc.get("give_back"), k)) for k, b in found.items()}
            body = self._collect(sc) if any(going.values()) else None
            for name, labeler in found.items():
                labeler.give_back(going[name])
                labeler.adopt(_strings(doc.get("adopt"), name))
            if body is None:
                return web.Response(status=204)
            return web.Response(body=body, content_type="application/octet-stream")

        sc.admin_app.router.add_get(FAMILIES_PATH, families)
        sc.admin_app.router.add_post(MODELS_PATH, models)
        sc.admin_app.router.add_get(LABELS_PATH, labels)
        sc.admin_app.router.add_post(LABELS_PATH, labels)

    def final(self, sc: Sidecar) -> None:
        body = self._pool.submit(self._collect, sc).result()
        partial = self._final_path + ".part"
        with open(partial, "wb") as f:
            f.write(body)
        os.replace(partial, self._final_path)


def _strings(doc: object, name: str) -> list[str]:
    """``doc[name]``'s strings, where ``doc`` is a mapping of label names to lists."""
    values = doc.get(name) if isinstance(doc, dict) else None
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


def _binder(plan: WorkerPlan) -> Callable[[Sidecar, ProxyRunner, SidecarRunner], Awaitable[None]]:
    async def bind(sc: Sidecar, proxy_runner: ProxyRunner, admin_runner: SidecarRunner) -> None:
        sock = reuse_port_socket(plan.listen_host, plan.listen_port)
        sock.listen(1024)
        await proxy_runner.port.listen_on(sock)
        await web.UnixSite(admin_runner, plan.admin_path).start()

    return bind


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` beside the others of the pod (SO_REUSEPORT: the kernel
    spreads new connections over the listening ones by their addresses' hash)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def worker_resource(environ: Mapping[str, str], index: int) -> str:
    """``OTEL_RESOURCE_ATTRIBUTES`` for worker ``index``: the pod's resource (every attribute
    the single process would have), and a ``service.instance.id`` of its own. Each worker
    exports its own cumulative metrics; two exporters under one identity would be one
    series written by two processes. The id is the one given, else the pod's uid or name,
    else the host's name, with ``-worker-<index>``."""
    attrs = resource_attributes(environ)
    base = (
        attrs.get(semconv.SERVICE_INSTANCE_ID)
        or attrs.get("k8s.pod.uid")
        or attrs.get("k8s.pod.name")
        or socket.gethostname()
    )
    given = environ.get(OTEL_RESOURCE_ATTRIBUTES, "").strip().strip(",")
    own = f"{semconv.SERVICE_INSTANCE_ID}={quote(f'{base}-worker-{index}', safe='')}"
    return f"{given},{own}" if given else own


def main() -> int:
    doc = json.loads(sys.stdin.buffer.read())
    settings = Settings.model_validate(doc["settings"])
    plan = WorkerPlan(**doc["plan"])
    os.environ[OTEL_RESOURCE_ATTRIBUTES] = worker_resource(os.environ, plan.index)
    configure_logging(settings.log_format, settings.log_level)
    prepare_process()
    ledger = InFlightLedger(plan.ledger_path)
    families = _Families(plan.final_path)
    worker = PodWorker(
        index=plan.index,
        bind=_binder(plan),
        admin_routes=families.route,
        stopped=families.final,
        ledger=ledger,
        parent_pid=plan.parent_pid,
    )
    try:
        asyncio.run(serve(settings, worker=worker))
    finally:
        ledger.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
