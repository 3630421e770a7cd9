"""What several test modules share: wire builders, raw-socket peers, the in-process rig,
process censuses, the chart's render helpers and the oracles tests compare with.

A test module imports from here, never from another test module (pytest imports each test
module under its own name, so a ``from tests.integration.test_x import ...`` loads the module
a second time, with its own fixtures and module state). ``tests/conftest.py`` keeps the
fixtures every test may ask for by name; the fixtures here (``rig_factory``,
``serve_process`` without the caller's environment, ``raw_upstream``) are imported by the
modules that use them.

On the wire:
- ``sse``: SSE events, OpenAI chat chunks, HTTP/1.1 chunked framing, a scripted aiohttp
  upstream.
- ``raw``: raw-socket upstreams and clients (bytes an HTTP library would refuse to send or read).
- ``scripted_server``: a raw TCP server that answers each connection with a script.
- ``http``: polling an endpoint until it answers a status.
- ``waits``: waiting on a condition instead of sleeping.

Running a sidecar and looking at it:
- ``in_process``: a sidecar (as ``serve`` starts it) and aiohttp apps in the test's event loop.
- ``rig``: the simulator and a sidecar on ``SidecarRunner`` in the test's event loop.
- ``serve``: ``llm-sidecar serve`` and ``simulate`` as subprocesses.
- ``processes``: third-party servers (Prometheus, Alertmanager, ...) as logged subprocesses.
- ``ports``: free ports for servers that cannot bind port 0.
- ``tools``: external tools on PATH (skipped locally, failed under ``CI=true`` when missing).
- ``census``: what a process holds (tasks, fds, TCP sockets, memory) from /proc.
- ``samples``: Prometheus samples from a ``/metrics`` page or a registry, OTel metric points.

Inputs and oracles:
- ``recordings``: bytes recorded from real servers, replayed through the observer.
- ``event_shapes``: chat-chunk payload shapes the event template must learn or refuse.
- ``fuzz``: the hostile byte mix the parsers are fuzzed with.
- ``timelines``: request timelines scripted by hand.
- ``tool_calls``: when each tool call of a recorded stream opens and ends, from the JSON.
- ``rules``: the default SLO spec and one that emits every alert.

The repository's files:
- ``paths``: the repository root and the chart.
- ``chart``: ``scripts/sync_chart.py`` as a module, and rendering the chart.
- ``image``: the Dockerfile read as instructions.
- ``prometheus_operator``: what the Prometheus Operator makes of the chart's objects.
"""
