"""Live servers for tests/real/: started once per session, as subprocesses, on free ports.

Every kind the session needs is launched at the first request for any of them, so the
slow vLLM start-ups (about a minute each, mostly compiling CPU graphs) overlap; each test
then waits only for its own server's ``/health``. A server whose install is missing skips
its tests locally with the reason and FAILS them under CI=true (``make test-real`` installs
everything first). ``REAL_SERVERS=transformers-serve,llama.cpp`` starts only the kinds
named (the others' tests skip), to run one server's tests without waiting for vLLM.
"""

from __future__ import annotations

import os

import pytest

from tests.real.servers import (
    LLAMACPP,
    TRANSFORMERS,
    VLLM,
    VLLM_FORCE_USAGE,
    RealServer,
    ServerKind,
    start,
)
from tests.support.skips import IN_CI

LIVE_KINDS = (VLLM, VLLM_FORCE_USAGE, LLAMACPP, TRANSFORMERS)


class Launcher:
    """Starts every installed live kind on first use; hands out ready servers."""

    def __init__(self, kinds: tuple[ServerKind, ...]) -> None:
        self._kinds = kinds
        self._servers: dict[str, RealServer] = {}
        self._failures: dict[str, str] = {}
        self._launched = False

    def _launch(self) -> None:
        self._launched = True
        only = {n for n in os.environ.get("REAL_SERVERS", "").split(",") if n}
        for kind in self._kinds:
            if (
                only and kind.name not in only
            ):  # REAL_SERVERS=transformers-serve,...: start just these
                continue
            why = kind.missing()
            if why is None:
                self._servers[kind.name] = start(kind)
            else:
                self._failures[kind.name] = why

    def get(self, kind: ServerKind) -> RealServer:
        if not self._launched:
            self._launch()
        if kind.name not in self._servers and kind.name not in self._failures:
            pytest.skip(f"{kind.name} is not in REAL_SERVERS")
        if kind.name in self._failures:
            message = self._failures[kind.name]
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        server = self._servers[kind.name]
        server.wait_ready()  # raises with the server's log tail if it died or never came up
        return server

    def stop(self) -> None:
        for server in self._servers.values():
            server.stop()


@pytest.fixture(scope="session")
def live_servers():
    launcher = Launcher(LIVE_KINDS)
    yield launcher
    launcher.stop()
