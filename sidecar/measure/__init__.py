"""Events and the clock -> one :class:`~sidecar.measure.timeline.RequestTimeline` per request."""
