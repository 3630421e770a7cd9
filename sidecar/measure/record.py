"""One request's record while it is in flight: what :meth:`~sidecar.relay.data.proxy.Proxy.open_record`
opened (its timeline, the labels it holds) and :meth:`~sidecar.relay.data.proxy.Proxy.close_record`
gives its verdict to, once."""

from __future__ import annotations

from collections.abc import Mapping

from .timeline import RequestTimeline

__all__ = ["RequestRecord"]


class RequestRecord:
    """``timeline``: the figures; ``label``: the model label the request started under (the
    in-flight gauge ends under it too); ``model``: the client's model name, if it gave one;
    ``headers``: the client's header fields (the tenant and objective headers are read from
    them, never changed); ``route``: the route template; ``tenant_held``: the tenant label
    held until the verdict; ``closed``: the verdict was given."""

    __slots__ = ("timeline", "label", "model", "headers", "route", "tenant_held", "closed")

    def __init__(
        self,
        timeline: RequestTimeline,
        label: str,
        model: str | None,
        headers: Mapping[str, str],
        route: str,
    ) -> None:
        self.timeline = timeline
        self.label = label
        self.model = model
        self.headers = headers
        self.route = route
        self.tenant_held: str | None = None
        self.closed = False
