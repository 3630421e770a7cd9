"""The command line as a newcomer meets it: each fault a first try of the real ``llm-sidecar``
executable can meet, checked the same way, in a subprocess."""

from __future__ import annotations

import json
import os
import re
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
from tests.support.raw import taken_port
from tests.support.serve import ServeProcess

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


def test_bare_command_prints_the_commands_not_an_error():
    done = run()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: llm-sidecar"), done.stdout
    for command in ("serve", "simulate", "demo", "slo"):
        assert re.search(rf"^\s+{command}\s+\S", done.stdout, re.M), command
    assert "error" not in done.stdout + done.stderr
    slo = run("slo")
    assert slo.returncode == 0 and re.search(r"^\s+render\s+\S", slo.stdout, re.M), slo.stderr


@pytest.mark.parametrize(
    ("argv", "unknown", "meant"),
    [
        (["serve", "--upstrem", "http://127.0.0.1:8000"], "--upstrem", "--upstream"),
        (["serve", "--upstream", "http://127.0.0.1:8000", "--read-timout=5"], "--read-timout=5", "--read-timeout"),
        (["demo", "--durration", "3"], "--durration", "--duration"),
        (["simulate", "--listen", "bad", "--tpo", "0.1"], "--tpo", "--tpot"),
    ],
)  # fmt: skip
def test_an_unknown_flag_gets_the_closest_flag_of_its_command(argv, unknown, meant):
    done = run(*argv)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert f"unrecognized arguments: {unknown}" in last and last.endswith(f"did you mean {meant}?")


@pytest.mark.parametrize(
    ("abbreviation", "meant"), [("--metrics", "--metrics-listen"), ("--up", "--upstream")]
)
def test_an_abbreviated_flag_is_refused_and_the_whole_one_suggested(abbreviation, meant):
    # The value is not a valid address either: an abbreviation taken as the flag would also
    # stop the start, but with that flag's own error instead.
    argv = ["serve", abbreviation, "not-an-address"]
    if abbreviation != "--up":
        argv += ["--upstream", "http://127.0.0.1:8000"]
    done = run(*argv)
    assert done.returncode == 2
    assert f"unrecognized arguments: {abbreviation} not-an-address" in done.stderr, done.stderr
    assert done.stderr.strip().endswith(f"did you mean {meant}?")


def test_a_misspelt_command_gets_the_closest_command():
    done = run("serv")
    assert done.returncode == 2
    assert "invalid choice: 'serv'" in done.stderr and done.stderr.strip().endswith(
        "did you mean serve?"
    )


def test_an_upstream_without_a_scheme_suggests_http():
    done = run("serve", "--upstream", "127.0.0.1:8000")
    assert done.returncode == 2
    assert done.stderr.strip().endswith("did you mean http://127.0.0.1:8000?"), done.stderr


def test_a_bad_boolean_lists_the_accepted_values():
    done = run("serve", "--upstream", "http://127.0.0.1:8000", "--access-log", "nope")
    assert done.returncode == 2
    line = done.stderr.strip()
    assert line.startswith("llm-sidecar: invalid access_log (--access-log): 'nope'"), line
    assert line.endswith("use one of true, false, 1, 0, yes, no, on, off"), line


def test_serve_help_names_no_removed_setting():
    out = run("serve", "--help").stdout
    assert "--upstream URL" in out
    assert "inject-stream-usage" not in out and "Removed" not in out


@contextmanager
def _serving(upstream: str, *extra: str):
    """serve on free ports, its stdout log kept (``sc.out``); stopped also on failure."""
    sc = ServeProcess(upstream, "--connect-timeout", "3", *extra, command=(CLI,), clean_env=True)
    try:
        sc.ports()
        yield sc
    finally:
        sc.proc.terminate()
        sc.proc.wait(timeout=20)
        sc.stop()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def _log_lines(sc: ServeProcess, event: str, count: int = 1) -> list[dict]:
    deadline = time.monotonic() + 20
    while True:
        found = []
        for line in list(sc.out):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == event:
                found.append(doc)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_https_against_a_plain_http_server_says_use_http():
    with _plain_http_server() as port, _serving(f"https://127.0.0.1:{port}") as sc:
        status, body = _post(sc.port)
        ready_status, _, ready = _get(f"{sc.admin_url}/readyz")
        watch_logs = _log_lines(sc, "upstream_unreachable")
    hint = f"use http://127.0.0.1:{port}"
    assert status == 502 and hint in body["error"]["message"], body
    assert "TLS handshake failed" in body["error"]["message"]
    assert ready_status == 503 and hint in json.loads(ready)["reason"], ready
    assert watch_logs and hint in watch_logs[0]["reason"], watch_logs


def test_a_tls_failure_that_is_not_plain_http_gives_no_http_hint():
    """A server that speaks TLS but refuses the handshake (a fatal handshake_failure alert, as
    a server without a common cipher sends): http:// would be the wrong advice."""
    alert = b"\x15\x03\x03\x00\x02\x02\x28"  # TLS record: alert, fatal, handshake_failure
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
                conn.recv(65536)  # the ClientHello
                conn.sendall(alert)

    threading.Thread(target=serve, daemon=True).start()
    try:
        with _serving(f"https://127.0.0.1:{srv.getsockname()[1]}") as sc:
            status, body = _post(sc.port)
    finally:
        srv.close()
    assert status == 502 and "TLS handshake failed" in body["error"]["message"], body
    assert "use http://" not in body["error"]["message"]


def test_the_admin_port_index_lists_its_endpoints_and_other_paths_stay_404(refused_url):
    with _serving(refused_url) as sc:
        status, kind, text = _get(f"{sc.admin_url}/")
        missing, _, _ = _get(f"{sc.admin_url}/nope")
        for path in ("/metrics", "/healthz", "/readyz", "/upstreamz", "/metrics/engine"):
            assert _get(f"{sc.admin_url}{path}")[0] != 404, path
    assert status == 200 and kind.startswith("text/plain"), (status, kind)
    lines = text.splitlines()
    for path in ("/metrics", "/healthz", "/readyz", "/upstreamz", "/metrics/engine"):
        line = next((ln for ln in lines if ln.split()[:1] == [path]), None)
        assert line is not None and len(line.split()) > 2, (path, text)
    assert missing == 404


def test_the_index_leaves_out_the_engine_page_when_it_is_off(refused_url):
    with _serving(refused_url, "--engine-metrics-path", "") as sc:
        _, _, text = _get(f"{sc.admin_url}/")
        engine, _, _ = _get(f"{sc.admin_url}/metrics/engine")
    assert "/metrics/engine" not in text and "/upstreamz" in text and engine == 404


def test_a_502_log_line_says_the_stream_flag_the_request_sent(refused_url):
    def post(stream: bool) -> int:
        body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        req = urllib.request.Request(
            f"http://127.0.0.1:{sc.port}/v1/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=20).close()
        except urllib.error.HTTPError as exc:
            return exc.code
        return 200

    with _serving(refused_url) as sc:
        assert post(True) == 502
        assert post(False) == 502
        lines = _log_lines(sc, "request", count=2)
    assert [(ln["status"], ln["error"], ln["stream"]) for ln in lines] == [
        (502, "upstream_unreachable", True),
        (502, "upstream_unreachable", False),
    ], lines
