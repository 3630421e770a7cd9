"""Reading a /metrics page as Prometheus reads it, for tests that check the page itself."""

from __future__ import annotations

__all__ = ["count_series"]


def count_series(page: bytes) -> int:
    """Samples in a text exposition: its lines that are not comments (HELP, TYPE, EOF). The
    sidecar counts its budget from the registry (``SeriesGate``); this counts what a scrape
    got, so a test can hold the two against each other."""
    return page.count(b"\n") - page.count(b"\n#") - page.startswith(b"#")
