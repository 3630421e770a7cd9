"""llm-sidecar: a streaming reverse proxy that measures how fast LLM users get tokens."""

__version__ = "0.1.0"
