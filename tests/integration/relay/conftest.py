"""The relay tests' shared fixtures, defined in tests/support: ``rig_factory``, ``simulator``
and ``serve_process`` (conftest's, without the caller's ``OTEL_*``/``LLM_SIDECAR_*``
environment) from rig.py, ``raw_upstream`` from raw.py."""

from tests.support.raw import raw_upstream
from tests.support.rig import rig_factory, serve_process, simulator

__all__ = ["raw_upstream", "rig_factory", "serve_process", "simulator"]
