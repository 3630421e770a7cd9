"""Sans-I/O: relayed bytes -> framing (SSE, NDJSON) -> per-dialect token events."""
