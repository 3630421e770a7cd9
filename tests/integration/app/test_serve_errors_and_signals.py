"""An operator's first day, over the real ``llm-sidecar`` executable: how the process
stops, what it says about its upstream, and the mistakes it refuses at start."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.raw import taken_port
from tests.support.serve import ServeProcess, start_simulator

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("llm-sidecar"))
ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("LLM_SIDECAR_", "OTEL_", "KUBERNETES_"))
}


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, timeout=30, env={**ENV, **(env or {})}
    )


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


class Sidecar(ServeProcess):
    """``llm-sidecar serve`` on ports it reports, read like a ``Popen``."""

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def poll(self) -> int | None:
        return self.proc.poll()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def communicate(self, timeout: float) -> tuple[str, str]:
        self.proc.wait(timeout=timeout)
        return self.stop()

    def logged(self, event: str) -> bool:
        return f'"{event}"' in "".join(self.out)


class Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.sidecars: list[Sidecar] = []

    def start(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
        )
        self.procs.append(proc)
        return proc

    def simulator(self, *extra: str) -> tuple[subprocess.Popen, int]:
        proc, port = start_simulator(*extra, command=(CLI,), env=ENV)
        self.procs.append(proc)
        _wait(lambda: _get(port, "/health")[0] == 200)
        return proc, port

    def sidecar(
        self, upstream_port: int, *extra: str, env: dict | None = None
    ) -> tuple[Sidecar, int, int]:
        sc = Sidecar(
            f"http://127.0.0.1:{upstream_port}",
            "--log-format",
            "json",
            *extra,
            command=(CLI,),
            clean_env=True,
            env=env,
        )
        self.sidecars.append(sc)
        port, admin = sc.ports()
        _wait(lambda: _get(admin, "/readyz")[0] == 200)
        return sc, port, admin

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)
        for sc in self.sidecars:
            sc.stop()


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.close()


def _events(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line)["event"])
        except (ValueError, KeyError, TypeError):
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_idle_serve_exits_at_once_without_a_false_upstream_gone_line(procs, sig):
    _, up = procs.simulator()
    sidecar, _, _ = procs.sidecar(up, "--drain-seconds", "30")
    sidecar.send_signal(sig)
    out, err = sidecar.communicate(timeout=10)  # not drain_seconds (30 s)
    assert sidecar.returncode == 0, err
    events = _events(out + err)
    assert "stopped" in events, events
    assert "upstream_gone_refusing_new" not in events, events
    assert "draining" not in events, events


def test_second_signal_forces_exit_while_a_stream_is_live(procs):
    _, up = procs.simulator("--ttft", "0", "--tpot", "0.5", "--tokens", "200")
    sidecar, port, _ = procs.sidecar(up, "--drain-seconds", "60")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps(
        {"model": "sim-llama-3-8b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.fp.readline()  # the stream is live
    sidecar.send_signal(signal.SIGINT)
    _wait(lambda: sidecar.logged("draining"))  # the first signal is handled
    assert sidecar.poll() is None, "a live stream is drained, not cut, on the first signal"
    sidecar.send_signal(signal.SIGINT)
    out, err = sidecar.communicate(timeout=10)  # the second signal is not ignored
    conn.close()
    assert "forced_exit" in _events(out + err)


@pytest.mark.parametrize(
    ("upstream", "says", "root"),
    [
        ("http://user:s3cret@127.0.0.1:28001", "credentials", "http://127.0.0.1:28001"),
        ("http://127.0.0.1:28001/?x=1", "query string", "http://127.0.0.1:28001"),
        ("http://127.0.0.1:28001/v1/chat/completions", "API path", "http://127.0.0.1:28001"),
        ("http://127.0.0.1:28001/api/chat", "API path", "http://127.0.0.1:28001"),
    ],
)
def test_bad_upstream_urls_are_refused_naming_the_root(upstream, says, root):
    done = run("serve", "--upstream", upstream, "--listen", "127.0.0.1:0")
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and root in done.stderr, done.stderr
    assert "s3cret" not in done.stdout + done.stderr


def test_misspelled_environment_variable_named_with_the_closest(tmp_path):
    done = run("serve", "--upstream", "http://127.0.0.1:1", env={"LLM_SIDECAR_READ_TIMOUT": "3"})
    assert done.returncode == 2
    assert (
        "LLM_SIDECAR_READ_TIMOUT" in done.stderr and "LLM_SIDECAR_READ_TIMEOUT?" in done.stderr
    ), done.stderr


def test_log_level_is_case_insensitive(procs):
    _, up = procs.simulator()
    sc, _, admin = procs.sidecar(
        up, env={"LLM_SIDECAR_LOG_LEVEL": "DEBUG"}
    )  # started at all: it was accepted
    assert _get(admin, "/healthz")[0] == 200
    assert sc.poll() is None


def test_config_errors_are_located(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("upstream: http://127.0.0.1:1\nmodel_allowlist: [a, b\nread_timeout: 3\n")
    done = run("serve", "--config", str(broken))
    assert done.returncode == 2
    assert "line 3, column" in done.stderr, done.stderr
    nested = tmp_path / "nested.yaml"
    nested.write_text("sidecar:\n  upstream: http://127.0.0.1:1\n")
    done = run("serve", "--config", str(nested))
    assert done.returncode == 2
    assert "unknown setting 'sidecar'" in done.stderr, done.stderr
    misspelled = tmp_path / "misspelled.yaml"
    misspelled.write_text("upstream: http://127.0.0.1:1\nread_timout: 3\n")
    done = run("serve", "--config", str(misspelled))
    assert "did you mean read_timeout?" in done.stderr, done.stderr


def test_upstream_outage_is_logged_once_each_way_in_plain_words(procs):
    server, up = procs.simulator()
    sidecar, port, admin = procs.sidecar(up)
    server.send_signal(signal.SIGTERM)
    server.communicate(timeout=10)
    status, body = _get(admin, "/readyz")
    assert status == 503
    reason = json.loads(body)["reason"]
    assert "connection refused (is it listening on that port?)" in reason, reason
    assert "Error" not in reason, reason  # no Python class name (main: ClientConnectorError)
    time.sleep(5)  # a few watch intervals and probes: still one line
    # The same port again (a server coming back where it was): taken meanwhile, this fails at
    # start, never passes wrongly; the kernel hands out ephemeral ports in turn, not the last freed.
    procs.start("simulate", "--listen", f"127.0.0.1:{up}")
    _wait(lambda: _get(admin, "/readyz")[0] == 200)
    time.sleep(3)
    sidecar.send_signal(signal.SIGTERM)
    out, err = sidecar.communicate(timeout=15)
    lines = [json.loads(ln) for ln in (out + err).splitlines() if ln.startswith("{")]
    down = [ln for ln in lines if ln.get("event") == "upstream_unreachable"]
    back = [ln for ln in lines if ln.get("event") == "upstream_reachable"]
    assert len(down) == 1 and "connection refused" in down[0]["reason"], down
    assert len(back) == 1 and back[0]["down_seconds"] >= 4, back


def test_bind_error_names_the_flag_of_the_admin_port():
    with taken_port() as port:
        done = run(
            "serve", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
            "--metrics-listen", f"127.0.0.1:{port}",
        )  # fmt: skip
    assert done.returncode == 2
    assert f"127.0.0.1:{port} (--metrics-listen)" in done.stderr, done.stderr


def test_make_demo_takes_port():
    if subprocess.run(["which", "make"], capture_output=True).returncode != 0:
        pytest.skip("make is not installed")
    root = ROOT
    done = subprocess.run(
        ["make", "-n", "demo", "PORT=18123", "DURATION=1"], cwd=root, capture_output=True, text=True
    )
    assert "--port 18123" in done.stdout, done.stdout
