"""The stack a live test stands up around a real inference server: the sidecar in front of it
(``python -m sidecar serve``, a subprocess on ports the kernel picks) and a real Prometheus
scraping the sidecar's admin port every second and evaluating the shipped rules every second,
as a cluster's would (the dashboards read their recorded series, the alerts are theirs).

The inference server is the caller's (tests/real/servers.py starts each kind with the same
flags everywhere); this module knows only the URL the sidecar points at, so it serves any
engine, a scripted one included."""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import aiohttp

from tests.support.processes import start_prometheus, stop_process
from tests.support.serve import ServeProcess
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_RULES = ROOT / "deploy" / "prometheus" / "llm-sidecar-rules.yaml"
SIDECAR_JOB = "llm-sidecar"

T = TypeVar("T")


@dataclass(frozen=True)
class LiveStack:
    sidecar: ServeProcess
    prometheus_url: str

    @property
    def proxy_url(self) -> str:
        return self.sidecar.url

    @property
    def admin_url(self) -> str:
        return self.sidecar.admin_url


def wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Callable[[], str]) -> None:
    """Until ``url`` answers 200; the process's log tail in the failure if it exits first or
    never answers (for tests without an event loop, before one starts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: exited {proc.returncode}\n{log()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not ready in {timeout} s\n{log()[-3000:]}")


def prometheus_config(
    admin_port: int,
    labels: dict[str, str],
    rule_files: tuple[Path, ...],
    extra_scrape_configs: tuple[dict, ...],
) -> dict:
    """Scrape and evaluate every second: the sidecar's admin port with ``labels`` as target
    labels (what a PodMonitor's relabelling adds in a cluster), then ``extra_scrape_configs``."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": SIDECAR_JOB,
                "static_configs": [{"targets": [f"127.0.0.1:{admin_port}"], "labels": labels}],
            },
            *extra_scrape_configs,
        ],
    }


@contextmanager
def sidecar_and_prometheus(
    upstream_url: str,
    workdir: Path,
    *flags: str,
    labels: dict[str, str],
    rule_files: tuple[Path, ...] = (SHIPPED_RULES,),
    extra_scrape_configs: tuple[dict, ...] = (),
) -> Iterator[LiveStack]:
    """The sidecar (``serve --upstream upstream_url *flags``) and Prometheus, both answering;
    both stopped on the way out, also when the block fails. The upstream need not be ready:
    the sidecar starts without it."""
    prometheus = require_tool("prometheus")
    sidecar = ServeProcess(upstream_url, *flags)
    prom: subprocess.Popen | None = None
    try:
        _, admin_port = sidecar.ports(timeout=60)
        config = prometheus_config(admin_port, labels, rule_files, extra_scrape_configs)
        prom, prom_port = start_prometheus(prometheus, workdir, config)
        url = f"http://127.0.0.1:{prom_port}"
        wait_http(f"{url}/-/ready", prom, 60, lambda: "(Prometheus logs to /dev/null)")
        wait_http(f"{sidecar.admin_url}/healthz", sidecar.proc, 60, lambda: "".join(sidecar.err))
        yield LiveStack(sidecar, url)
    finally:
        if prom is not None:
            stop_process(prom, timeout=30)
        sidecar.stop()


async def query(session: aiohttp.ClientSession, prometheus_url: str, expr: str) -> list[dict]:
    """An instant query's result vector (asserting Prometheus accepted the expression)."""
    async with session.get(f"{prometheus_url}/api/v1/query", params={"query": expr}) as r:
        data = await r.json()
    assert data["status"] == "success", data
    return data["data"]["result"]


async def until(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    """Poll ``check`` every half second until it returns something true; that value. Fails
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.5)
