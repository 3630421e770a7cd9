"""Real inference servers as subprocesses: where their installs live, how to start them, and
the requests every live test and recording makes.

Shared by ``tests/real/`` and ``scripts/record-real-streams.py`` so both start a server with
the same flags and ask it the same things. The installs are the repo's own scripts
(``scripts/install-vllm.sh``, ``scripts/install-llamacpp.sh``,
``scripts/install-transformers.sh``), cached under ``.tools/``.
This module starts processes and polls ``/health``; it never imports the sidecar.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.skips import IN_CI

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("TOOLS_DIR", ROOT / ".tools"))
if not TOOLS.is_absolute():
    TOOLS = ROOT / TOOLS
AIPERF = TOOLS / "aiperf-venv" / "bin" / "aiperf"
VLLM_PYTHON = TOOLS / "vllm-venv" / "bin" / "python"
LLAMA_SERVER = TOOLS / "llama.cpp" / "bin" / "llama-server"
TRANSFORMERS_SERVE = TOOLS / "transformers-venv" / "bin" / "transformers"
HF_MODEL = TOOLS / "models" / "tiny-llama"
GGUF_MODEL = TOOLS / "models" / "tiny-llama.gguf"
LOGS = TOOLS / "logs"

MODEL = "tiny"
"""The served model name, the ``model`` field of every request."""

READY_TIMEOUT = float(os.environ.get("REAL_SERVER_READY_TIMEOUT", "600"))
"""vLLM on 2 shared cores compiles its CPU graphs before /health answers (60-200 s)."""


@dataclass(frozen=True)
class ServerKind:
    """One way of running one server: the flags, the routes it serves, where recordings go."""

    name: str  # pytest id and log file name
    engine: str  # "vllm", "llama.cpp" or "transformers"
    flags: tuple[str, ...] = ()
    routes: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions")
    variant: str = ""  # the recordings folder: <engine>-<version><variant>

    @property
    def model(self) -> str:
        """The ``model`` every request names: ``transformers serve`` pinned to a folder takes
        only that folder's path as given (any other name is a 400); it is started in the
        models folder with the relative name, so its answers name ``tiny-llama@main`` rather
        than a machine's path."""
        return HF_MODEL.name if self.engine == "transformers" else MODEL

    @property
    def cwd(self) -> Path:
        return HF_MODEL.parent if self.engine == "transformers" else ROOT

    def fixture_dir(self, version: str) -> str:
        return f"{self.engine}-{version}{self.variant}"

    def missing(self) -> str | None:
        """Why this server cannot start here, or None when its install is in place."""
        if self.engine in ("vllm", "transformers"):
            binary, name, script = (
                (VLLM_PYTHON, "vLLM", "install-vllm.sh")
                if self.engine == "vllm"
                else (TRANSFORMERS_SERVE, "transformers serve", "install-transformers.sh")
            )
            if not binary.exists():
                return f"{name} is not installed ({binary}; run scripts/{script})"
            if not (HF_MODEL / "config.json").exists():
                return f"the tiny model is missing ({HF_MODEL}; run scripts/install-vllm.sh)"
            return None
        if not LLAMA_SERVER.exists():
            return f"llama.cpp is not built ({LLAMA_SERVER}; run scripts/install-llamacpp.sh)"
        if not GGUF_MODEL.exists():
            return f"the tiny GGUF model is missing ({GGUF_MODEL}; run scripts/install-llamacpp.sh)"
        return None

    def command(self, port: int) -> list[str]:
        if self.engine == "vllm":
            return [
                str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(HF_MODEL), "--served-model-name", MODEL,
                "--host", "127.0.0.1", "--port", str(port),
                "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "8",
                *self.flags,
            ]  # fmt: skip
        if self.engine == "transformers":
            # The positional model is preloaded and serves every request, whatever its "model".
            return [
                str(TRANSFORMERS_SERVE), "serve", HF_MODEL.name,
                "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32",
                *self.flags,
            ]  # fmt: skip
        return [
            str(LLAMA_SERVER), "-m", str(GGUF_MODEL), "--alias", MODEL,
            "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-t", "1", "--no-webui", "--metrics",
            *self.flags,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.engine == "vllm":
            env.update(
                VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", HF_HUB_OFFLINE="1"
            )
        elif self.engine == "transformers":
            # Offline; /v1/models answers 500 unless HF_HOME/hub exists.
            home = TOOLS / "transformers-home"
            (home / "hub").mkdir(parents=True, exist_ok=True)
            env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(home))
        return env


VLLM = ServerKind("vllm", "vllm")
VLLM_FORCE_USAGE = ServerKind(
    "vllm-force-usage", "vllm", ("--enable-force-include-usage",), variant="-force-include-usage"
)
VLLM_REQUEST_METRICS = ServerKind(
    "vllm-per-request-metrics",
    "vllm",
    ("--enable-per-request-metrics",),
    variant="-per-request-metrics",
)
LLAMACPP = ServerKind(
    "llama.cpp", "llama.cpp", routes=("/v1/chat/completions", "/v1/completions", "/completion")
)
TRANSFORMERS = ServerKind("transformers-serve", "transformers")
KINDS = {k.name: k for k in (VLLM, VLLM_FORCE_USAGE, VLLM_REQUEST_METRICS, LLAMACPP, TRANSFORMERS)}


def free_port() -> int:
    """A port free a moment ago, for servers that cannot report a port-0 bind before they
    are ready (vLLM binds after loading the model). Racy: a server that lost its port exits,
    and :meth:`RealServer.wait_ready` reports that with its log. (tests/conftest.py's
    ``retry_on_port_clash`` is the retrying form, for servers that start in seconds.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RealServer:
    """A started server process; :meth:`wait_ready` blocks until ``/health`` answers 200."""

    kind: ServerKind
    port: int
    process: subprocess.Popen
    log_path: Path
    started: float = field(default_factory=time.monotonic)
    ready_after: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        if self.ready_after is not None:
            return
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.kind.name} exited with {self.process.returncode} before it was ready:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        self.ready_after = time.monotonic() - self.started
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(
            f"{self.kind.name} was not ready within {timeout:.0f} s:\n{self.log_tail()}"
        )

    def get_json(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as resp:
            return json.loads(resp.read())

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as resp:
            return resp.read().decode()

    def version(self) -> str:
        """The server's own version string: vLLM's ``/version``, llama.cpp's ``/props`` build."""
        if self.kind.engine == "vllm":
            return str(self.get_json("/version")["version"])
        if self.kind.engine == "transformers":
            out = subprocess.run([str(TRANSFORMERS_SERVE.parent / "python"), "-c", "import transformers; print(transformers.__version__)"],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            return out.stdout.strip()
        build = str(self.get_json("/props").get("build_info", "unknown"))
        return build.split("-", 1)[0]  # "b11434-unknown": the tarball has no git commit

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start(kind: ServerKind, log_path: Path | None = None) -> RealServer:
    """Start ``kind`` on a free port, its output in ``log_path`` (default
    ``.tools/logs/<name>.log``, the session's own servers'); not yet ready."""
    LOGS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = log_path or LOGS / f"{kind.name}.log"
    log = open(log_path, "wb")
    process = subprocess.Popen(
        kind.command(port),
        env=kind.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=kind.cwd,
    )
    log.close()  # the child holds its own descriptor
    return RealServer(kind, port, process, log_path)


# -- the requests ---------------------------------------------------------------------------

MAX_TOKENS = 12
SEED = 7
CHAT_MESSAGES = [{"role": "user", "content": "Say something about the licence terms."}]
PROMPT = "The licence terms say"


@dataclass(frozen=True)
class Case:
    """One request: a route, streamed or not, with or without ``stream_options.include_usage``."""

    route: str
    stream: bool
    include_usage: bool

    @property
    def name(self) -> str:
        base = {
            "/v1/chat/completions": "chat",
            "/v1/completions": "completions",
            "/completion": "completion",
        }[self.route]
        return base + ("-stream" if self.stream else "") + ("-usage" if self.include_usage else "")

    def body(self, model: str = MODEL) -> dict:
        """Greedy (temperature 0) with a seed: two identical requests give the same tokens."""
        if self.route == "/v1/chat/completions":
            body: dict = {"model": model, "messages": CHAT_MESSAGES, "max_tokens": MAX_TOKENS}
        elif self.route == "/v1/completions":
            body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
        else:  # llama.cpp's native route
            body = {"prompt": PROMPT, "n_predict": MAX_TOKENS}
        body.update(temperature=0, seed=SEED)
        if self.stream:
            body["stream"] = True
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        return body


def cases(kind: ServerKind) -> list[Case]:
    return [
        Case(route, stream, usage)
        for route in kind.routes
        for stream in (True, False)
        for usage in (False, True)
    ]


@contextmanager
def serving(kind: ServerKind) -> Iterator[RealServer]:
    """``kind`` started and ready for the block, stopped after it; skipped when its install is
    missing locally, failed in CI."""
    why = kind.missing()
    if why is not None:
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)
    server = start(kind)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def require_aiperf() -> None:
    """Skip without aiperf locally; fail in CI (scripts/install-aiperf.sh installs it)."""
    if not AIPERF.exists():
        message = f"aiperf is not installed ({AIPERF}; run scripts/install-aiperf.sh)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
