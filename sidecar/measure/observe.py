"""Watches a copy of the response bytes and feeds the request's timeline.

The proxy has already written each chunk to the client when it hands the same chunk here,
so nothing in this module can delay or alter what the client receives. Any exception from
a dialect is contained: the observer stops interpreting that response, counts one parse
error and lets the relay go on.

A non-streamed JSON body is kept as it came while it is small (up to
``SMALL_JSON_BYTES``) and parsed whole at the end, as always; a larger one is read by a
:class:`~sidecar.measure.json_skeleton.JsonSkeleton` as it arrives, and only the small copy
it keeps is parsed (a large body of tiny objects parsed whole multiplies the sidecar's memory:
docs/performance.md, "Figures behind the code").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import structlog

from ..base.routes import Route
from ..streams.dialects import StreamDialect, dialect_of
from ..streams.protocols.events import DialectEvent, ParseError
from .json_skeleton import JsonSkeleton
from .timeline import RequestTimeline

if TYPE_CHECKING:
    from ..streams.protocols.events import TokenKind
    from ..streams.protocols.template import EventTemplate

__all__ = ["ResponseObserver", "SMALL_JSON_BYTES"]

SMALL_JSON_BYTES = 64 << 10
"""Up to this size a JSON body is kept whole and parsed by orjson (as
``RequestFieldScanner``'s callers do): exactly what the parsers always read, far cheaper
than the skeleton for the common small body, and a bounded set of objects, freed at once."""

_log = structlog.get_logger("sidecar.observe")

_MIMES: dict[str, str] = {}
"""A ``Content-Type`` value's media type, lowered, by the value as the server wrote it (a
server writes one or two values, every response)."""
_MIMES_KEPT = 64


class ResponseObserver:
    """Per-response: decides how to read the body from its content type, then reads it."""

    __slots__ = (
        "timeline",
        "streaming",
        "templated",
        "_timeline",
        "_dialect",
        "_json_parser",
        "_json_parts",
        "_json_size",
        "_json_limit",
        "_skeleton",
    )

    def __init__(
        self,
        route: Route,
        timeline: RequestTimeline,
        content_type: str,
        content_encoding: str = "",
        max_json_bytes: int = 16 << 20,
        max_line_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._timeline = self.timeline = timeline
        self.streaming = False  # a token stream, read by its dialect
        self.templated = False  # whose dialect may learn a repeating event's template
        dialect = dialect_of(route)
        if (
            dialect is not None
            and dialect.head is not None
            and route.reads_head
            and headers is not None
        ):
            self._head(dialect.head, headers)
        self._dialect: StreamDialect | None = None
        self._json_parser: Callable[[bytes], list[DialectEvent]] | None = None
        self._json_parts: list[bytes] = []
        self._json_size = 0
        self._json_limit = max_json_bytes
        self._skeleton: JsonSkeleton | None = None  # once the body outgrew SMALL_JSON_BYTES
        if content_encoding and content_encoding.lower() != "identity":
            return  # compressed bytes: relayed untouched, not interpreted
        if dialect is None:
            return
        mime = _MIMES.get(content_type)
        if mime is None:
            mime = content_type.split(";", 1)[0].strip().lower()
            if len(_MIMES) < _MIMES_KEPT:
                _MIMES[content_type] = mime
        if mime == route.stream_mime:
            kwargs: dict[str, int | str | None] = (
                {"max_line_bytes": max_line_bytes} if max_line_bytes else {}
            )
            if route.model_from_path:
                kwargs["model"] = timeline.model or None
            self._dialect = dialect.stream(**kwargs)
            self.streaming = True
            # (a templated dialect learns from the start: sidecar/streams/protocols/template.py)
            self.templated = getattr(self._dialect, "_learning", 0) > 0
            timeline.end_marker_expected = getattr(self._dialect, "HAS_END_MARKER", False)
        elif mime == "application/json":
            self._json_parser = dialect.json

    def steady(self) -> tuple[EventTemplate, TokenKind] | None:
        """``(template, kind)`` while the dialect has a template armed whose event is one
        token of ``kind`` (a :class:`~sidecar.streams.protocols.events.TokenKind`): what
        :mod:`sidecar.relay.data.token_lane` builds a lane from; else None."""
        if not self.templated:
            return None
        memo: EventTemplate | None = self._dialect._memo  # type: ignore[union-attr]  # templated: an SSEJSONDialect
        if memo is None or memo.one_token is None:
            return None
        return memo, memo.one_token

    def feed(self, chunk: bytes, now: float) -> None:
        """``now``: when the proxy read the chunk from the upstream, before relaying it."""
        if self._dialect is not None:
            try:
                events = self._dialect.feed(chunk)
            except Exception:  # a dialect bug must never reach the relay
                self._give_up("feed")
                return
            if events:
                self._timeline.events(events, now)
        elif self._json_parser is not None:
            self._json_size += len(chunk)
            if self._json_size > self._json_limit:
                self._not_inspected()
                return
            skeleton = self._skeleton
            parts: Sequence[bytes]
            if skeleton is None:
                self._json_parts.append(chunk)
                if self._json_size <= SMALL_JSON_BYTES:
                    return
                # Too large to keep: from here on only its skeleton is kept.
                self._skeleton = skeleton = JsonSkeleton()
                parts, self._json_parts = self._json_parts, []
            else:
                parts = (chunk,)
            try:
                for part in parts:
                    skeleton.feed(part)
            except Exception:  # a reader bug must never reach the relay
                _log.exception("json_skeleton_failed", route=self._timeline.route)
                self._not_inspected()
                return
            if skeleton.failed:
                self._not_inspected()

    def _not_inspected(self) -> None:
        """Past a bound (``max_response_inspect_bytes``, or the skeleton's): the body is
        relayed unread and counts one parse error."""
        self._json_parser = None
        self._json_parts = []
        self._skeleton = None
        self._timeline.parse_errors += 1

    def close(self, now: float) -> None:
        """The body ended (cleanly or not): flush what the framing still holds."""
        if self._dialect is not None:
            try:
                events = self._dialect.close()
            except Exception:
                self._give_up("close")
                return
            if events:
                self._timeline.events(events, now)
        elif self._json_parser is not None and (self._json_parts or self._skeleton is not None):
            if self._skeleton is not None:
                skeleton, self._skeleton = self._skeleton, None
                try:
                    body = skeleton.close()
                except Exception:
                    _log.exception("json_skeleton_failed", route=self._timeline.route)
                    body = None
                if body is None:
                    self._not_inspected()
                    return
            else:
                body = b"".join(self._json_parts)
                self._json_parts = []
            try:
                events = self._json_parser(body)
            except Exception:
                _log.exception("json_parser_failed")
                self._timeline.events([ParseError("parser failed")], now)
                return
            self._timeline.events(events, now)

    def _head(
        self,
        parser: Callable[[Mapping[str, str]], list[DialectEvent]],
        headers: Mapping[str, str],
    ) -> None:
        """Facts the response head carries (TGI's timing headers); they have no time of
        their own, so they are stamped with the request's start."""
        try:
            events = parser(headers)
        except Exception:  # a parser bug must never reach the relay
            _log.exception("head_parser_failed", route=self._timeline.route)
            self._timeline.parse_errors += 1
            return
        if events:
            self._timeline.events(events, self._timeline.start)

    def _give_up(self, where: str) -> None:
        _log.exception("dialect_failed", where=where, route=self._timeline.route)
        self._dialect = None
        self.streaming = self.templated = False
        self._timeline.parse_errors += 1
        # Unread from here on: whether the end marker came is unknown, not missing.
        self._timeline.end_marker_expected = False
