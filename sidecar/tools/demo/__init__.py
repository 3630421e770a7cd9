"""``llm-sidecar demo``: a simulated server, the sidecar and load, with live figures.

One module per concern, each importing only those before it:

=================  ==========================================================================
``exposition``     ``/metrics`` text -> one ``Snapshot`` (pure)
``quantiles``      PromQL's ``increase()``, ``histogram_quantile()``, the sliding window (pure)
``load``           the clients and their request mix
``draw``           the live table, the curve by band, the summary
``supervise``      the simulator and sidecar subprocesses: ports, start, readiness, stop
``main``           :func:`run_demo`, which wires them together
=================  ==========================================================================
"""

from .main import METRICS_PORT_OFFSET, metrics_port_for, run_demo

__all__ = ["METRICS_PORT_OFFSET", "metrics_port_for", "run_demo"]
