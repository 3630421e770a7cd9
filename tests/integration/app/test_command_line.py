"""The command line as a newcomer meets it: each fault a first try of the real ``llm-sidecar``
executable can meet, checked the same way, in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from sidecar import __version__
from tests.conftest import ServeProcess
from tests.support.raw import taken_port

CLI = str(Path(sys.executable).with_name("llm-sidecar"))
ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith("LLM_SIDECAR_") and not k.startswith("OTEL_")
}
ENV["COLUMNS"] = (
    "250"  # argparse wraps help to the terminal; one line per option is easier to check
)


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=ENV)


def test_version_prints_the_package_version():
    done = run("--version")
    assert done.returncode == 0, done.stderr
    first, *rest = done.stdout.strip().splitlines()
    assert first.startswith(f"llm-sidecar {__version__} (Python "), first
    from sidecar.base.speedups import IN_C

    # Says whether the C speedups are loaded, and warns only when they are not.
    assert first.endswith("C speedups on)" if IN_C else "C speedups off)"), first
    assert rest == ([] if IN_C else rest) and all(line.startswith("warning:") for line in rest)


def test_serve_help_shows_upstream_as_required_and_explains_logging():
    out = run("serve", "--help").stdout
    usage = out.split("\n\n")[0]
    assert "--upstream URL" in usage and "[--upstream" not in usage
    assert "--log-format {json,console}" in out
    assert "--log-level {debug,info,warning,error}" in out
    level_help = out.split("--log-level {debug,info,warning,error}")[1].split("--access-log")[0]
    assert "Least severe level logged" in level_help


def test_simulate_help_shows_defaults():
    help_lines = run("simulate", "--help").stdout.splitlines()  # COLUMNS=250: one line per option
    for flag, default in (
        ("--ttft", "0.2"),
        ("--tokens", "64"),
        ("--jitter", "0.1"),
        ("--model", "sim-llama-3-8b"),
    ):
        line = next(ln for ln in help_lines if ln.strip().startswith(f"{flag} {flag[2:].upper()} "))
        assert f"(default: {default})" in line, line


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["serve", "--bad-flag"], "usage: llm-sidecar serve --upstream URL"),
        (["demo", "--bad-flag"], "usage: llm-sidecar demo"),
        (["slo", "render", "spec.yaml", "--bad-flag"], "usage: llm-sidecar slo render"),
    ],
)
def test_unknown_flag_prints_the_usage_of_its_own_command(argv, usage):
    done = run(*argv)
    assert done.returncode == 2
    assert done.stderr.startswith(usage), done.stderr
    assert "unrecognized arguments: --bad-flag" in done.stderr
    assert "COMMAND" not in done.stderr


def test_openai_base_url_as_upstream_is_refused_with_the_root_to_use():
    done = run("serve", "--upstream", "http://127.0.0.1:8000/v1")
    assert done.returncode == 2
    assert "/v1/v1/chat/completions" in done.stderr
    assert done.stderr.strip().endswith("Give the server's root instead: http://127.0.0.1:8000")


def test_port_in_use_is_one_clear_line_and_no_stopped_event():
    with taken_port() as port:
        done = run(
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "127.0.0.1:0",
        )
    assert done.returncode == 2
    assert done.stderr.startswith(f"llm-sidecar: cannot listen on 127.0.0.1:{port} (--listen):")
    assert f"{port}" in done.stderr and "address already in use" in done.stderr.lower()
    assert len(done.stderr.strip().splitlines()) == 1
    assert '"stopped"' not in done.stdout + done.stderr


@contextmanager
def _sidecar(upstream: str):
    sc = ServeProcess(
        upstream, "--connect-timeout", "3", command=(CLI,), clean_env=True, env={"COLUMNS": "250"}
    )
    proc = sc.proc
    try:
        port, admin = sc.ports()
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "sidecar did not start"
                time.sleep(0.1)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        sc.stop()


def _post(port: int) -> tuple[int, dict]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@contextmanager
def _plain_http_server():
    """Answers every connection with plain HTTP at once: a TLS client fails its handshake."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()


@pytest.mark.parametrize("cause", ["refused", "dns", "tls"])
def test_unreachable_upstream_502_names_its_cause(cause, refused_url):
    with _plain_http_server() as tls_port:
        upstream = {
            "refused": refused_url,
            "dns": "http://no-such-host.invalid:8000",
            "tls": f"https://127.0.0.1:{tls_port}",
        }[cause]
        with _sidecar(upstream) as (port, _):
            status, body = _post(port)
    assert status == 502
    assert body["error"]["type"] == "upstream_unreachable"
    message = body["error"]["message"]
    expected = {
        "refused": "is unreachable: connection refused",
        "dns": "is unreachable: cannot resolve its host name 'no-such-host.invalid'",
        "tls": "is unreachable: TLS handshake failed",
    }[cause]
    assert expected in message, message
