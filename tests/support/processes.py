"""The processes a test starts (Prometheus, Alertmanager, VictoriaMetrics, a server): each
logged to a file, waited for until it answers, and ended politely first; and a real
Prometheus started from a configuration given as a dict."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import aiohttp
import yaml

from tests.support.ports import retry_on_port_clash


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Processes:
    """Subprocesses this test starts, stopped by their own handles at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], log: Path) -> subprocess.Popen:
        fh = log.open("w")
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)
        fh.close()
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)


async def wait_ready(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen, log: Path
) -> None:
    """Until ``url`` answers 200 (30 s at most); the process's log in the failure if it
    exits or never answers."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args[0]} exited:\n{log.read_text()[-2000:]}"
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"{url} not ready:\n{log.read_text()[-2000:]}")


def start_prometheus(binary: str, workdir, config: dict) -> tuple[subprocess.Popen, int]:
    """A real Prometheus on a free loopback port (retried if the port is taken), with ``config``
    (a prometheus.yml as a dict) and its data under ``workdir``. The caller terminates it."""
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return retry_on_port_clash(
        lambda port: subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    )  # fmt: skip
