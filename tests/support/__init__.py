"""What several test modules share: wire builders, raw-socket peers, the in-process rig,
process censuses and the chart's render helpers.

A test module imports from here, never from another test module (pytest imports each test
module under its own name, so a ``from tests.integration.test_x import ...`` loads the module
a second time, with its own fixtures and module state). ``tests/conftest.py`` keeps the
fixtures every test may ask for by name; the fixtures here are imported by the modules that
use them.

- ``sse``: SSE events, OpenAI chat chunks, HTTP/1.1 chunked framing, a scripted aiohttp
  upstream.
- ``raw``: raw-socket peers and clients (bytes an HTTP library would refuse to send or read).
- ``scripted_server``: a raw TCP server that answers each connection with a script.
- ``rig``: the simulator and a sidecar on ``SidecarRunner`` in the test's event loop.
- ``census``: what a process holds (tasks, fds, TCP sockets, memory) from /proc.
- ``chart``: ``scripts/sync_chart.py`` as a module, and rendering the chart.
- ``prometheus_operator``: what the Prometheus Operator makes of the chart's objects.
"""
