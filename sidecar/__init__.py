"""llm-sidecar: a streaming reverse proxy that measures how fast LLM users get tokens."""

from importlib.metadata import PackageNotFoundError, version

# pyproject.toml's version is the one source (the Makefile's image tag and the chart's
# appVersion follow it too); the installed distribution's metadata carries it here.
try:
    __version__: str = version("llm-sidecar-proxy")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
