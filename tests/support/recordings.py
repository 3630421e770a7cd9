"""Bytes recorded from real servers (tests/fixtures/real/, each beside its ``.meta.json``: the
request, the response's status and headers), and their replay through the sidecar's
observer: the reading the recordings' tests compare with the server's own account."""

from __future__ import annotations

import json
from pathlib import Path

from sidecar.base.outcomes import Outcome
from sidecar.base.routes import match_route
from sidecar.measure.observe import ResponseObserver
from sidecar.measure.timeline import RequestTimeline

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"  # tests/fixtures/real


def recordings() -> list[Path]:
    return sorted(
        p
        for p in REAL.glob("*/*")
        if p.suffix in (".sse", ".json") and not p.name.endswith(".meta.json")
    )


RECORDINGS = recordings()
STREAMS = [p for p in RECORDINGS if p.suffix == ".sse"]


def meta(path: Path) -> dict:
    return json.loads(path.with_name(path.stem + ".meta.json").read_text())


class _SeeingTimeline(RequestTimeline):
    """A timeline that also keeps every dialect event it was given."""

    __slots__ = ("seen",)

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.seen: list = []

    def events(self, events, now: float) -> None:
        self.seen.extend(events)
        super().events(events, now)


def replay(path: Path, chunks: list[bytes]) -> tuple[RequestTimeline, list]:
    """Feed ``chunks`` through a fresh observer; returns the finished timeline and every
    dialect event it received."""
    info = meta(path)
    route, _ = match_route(info["request"]["path"])
    headers = {k.lower(): v for k, v in info["response"]["headers"].items()}
    timeline = _SeeingTimeline(
        0.0, "POST", route.template, info["request"]["body"].get("model", "")
    )
    observer = ResponseObserver(route, timeline, headers.get("content-type", ""))
    timeline.response_started(0.001, info["response"]["status"], observer.streaming)
    now = 0.001
    for chunk in chunks:
        now += 0.001
        observer.feed(chunk, now)
    observer.close(now)
    timeline.finish(Outcome.OK, now + 0.001)
    return timeline, timeline.seen
