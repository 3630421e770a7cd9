"""What the standard ``OTEL_*`` environment asks of the sidecar: which exporters, which OTLP
protocol and endpoint, the resource, the GenAI naming, whether the SDK is off.

Apart because it is policy, not plumbing: every function here reads a plain mapping (the
process environment by default) and returns plain values, so it is tested without building a
provider, and :mod:`sidecar.export.otel_setup` only acts on the answers. The variable names
are the SDK's own constants (``opentelemetry.sdk.environment_variables``,
``opentelemetry.environment_variables``).

What the SDK reads itself is left to it and not repeated here: the OTLP exporters' endpoint,
headers, TLS, timeout and compression (``OTEL_EXPORTER_OTLP_*``, read when an exporter is
built with no arguments), the sampler (``OTEL_TRACES_SAMPLER[_ARG]``), batching
(``OTEL_BSP_*``), the export interval (``OTEL_METRIC_EXPORT_INTERVAL``) and the resource
detectors ``Resource.create`` runs (``OTEL_RESOURCE_DETECTORS``). What is read here differs
from the SDK on purpose; each function says how and why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import unquote

import structlog
from opentelemetry.environment_variables import OTEL_METRICS_EXPORTER, OTEL_TRACES_EXPORTER
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_RESOURCE_ATTRIBUTES,
    OTEL_SDK_DISABLED,
    OTEL_SERVICE_NAME,
)

from .. import __version__
from . import semconv as sc

__all__ = [
    "DEFAULT_PROTOCOL",
    "genai_latest_names",
    "otlp_endpoint",
    "otlp_protocol",
    "resource_attributes",
    "sdk_disabled",
    "wanted_exporters",
]

_log = structlog.get_logger("sidecar.tracing")

_SUPPORTED_EXPORTERS = frozenset({"otlp", "console"})
_PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PROTOCOL = "http/protobuf"  # the OTLP exporter spec's default

# Per signal ("TRACES", "METRICS"): the SDK's variable names.
_EXPORTER_VARIABLE = {"TRACES": OTEL_TRACES_EXPORTER, "METRICS": OTEL_METRICS_EXPORTER}
_ENDPOINT_VARIABLE = {
    "TRACES": OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    "METRICS": OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
}
_PROTOCOL_VARIABLE = {
    "TRACES": OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    "METRICS": OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
}


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def sdk_disabled(environ: Mapping[str, str]) -> bool:
    """``OTEL_SDK_DISABLED`` turns both signals off.

    Ours, not the SDK's ``parse_boolean_environment_variable``: that takes only ``true``, so
    ``OTEL_SDK_DISABLED=1`` (or ``yes``, ``on``) would leave telemetry on; here it turns it off."""
    return _truthy(environ.get(OTEL_SDK_DISABLED))


def otlp_endpoint(environ: Mapping[str, str], signal: str) -> str:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``, as
    written (trimmed), or ``""`` when neither is set. The exporter reads its own endpoint;
    this says whether one is configured and names it in the sidecar's own log lines."""
    return (
        environ.get(_ENDPOINT_VARIABLE[signal], "").strip()
        or environ.get(OTEL_EXPORTER_OTLP_ENDPOINT, "").strip()
    )


def wanted_exporters(environ: Mapping[str, str], signal: str) -> set[str]:
    """Exporters for ``signal`` (``TRACES`` or ``METRICS``) from ``OTEL_<SIGNAL>_EXPORTER``.

    Unlike the SDK's own auto-configuration, an unset variable means "otlp only if an OTLP
    endpoint is configured" (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT``), so a sidecar without a collector exports
    nothing and builds no provider. ``none`` turns the signal off.
    """
    variable = _EXPORTER_VARIABLE[signal]
    raw = environ.get(variable, "").strip()
    if raw:
        names = {n.strip().lower() for n in raw.split(",") if n.strip()}
        if "none" in names:
            return set()
        unknown = names - _SUPPORTED_EXPORTERS
        if unknown:
            _log.warning("otel_exporter_unsupported", variable=variable, ignored=sorted(unknown))
        return names & _SUPPORTED_EXPORTERS
    if otlp_endpoint(environ, signal):
        return {"otlp"}
    return set()


def otlp_protocol(environ: Mapping[str, str], signal: str) -> str:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``, else
    ``http/protobuf``. An unsupported value (e.g. ``http/json``) falls back to
    ``http/protobuf`` with a warning: same port on a Collector, and telemetry config must not
    stop the proxy (the SDK's auto-configuration raises ``RuntimeError`` instead)."""
    for var in (_PROTOCOL_VARIABLE[signal], OTEL_EXPORTER_OTLP_PROTOCOL):
        value = environ.get(var, "").strip().lower()
        if value:
            if value in _PROTOCOLS:
                return value
            _log.warning(
                "otel_protocol_unsupported", variable=var, value=value, using=DEFAULT_PROTOCOL
            )
            return DEFAULT_PROTOCOL
    return DEFAULT_PROTOCOL


def _parse_resource_attributes(raw: str) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES``: ``k=v,k2=v2`` with percent-encoded values."""
    out: dict[str, str] = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            continue
        out[key] = unquote(value.strip())
    return out


def resource_attributes(environ: Mapping[str, str]) -> dict[str, str]:
    """Resource attributes, lowest precedence first: defaults (``service.name`` =
    ``llm-sidecar``, ``service.version``), Kubernetes downward-API variables
    (``K8S_POD_NAME`` -> ``k8s.pod.name``, see :data:`sidecar.export.semconv.K8S_ENV_ATTRIBUTES`),
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``.

    Ours, not the SDK's ``OTELResourceDetector``: its result sits below the attributes handed
    to ``Resource.create`` (our defaults and ``K8S_*`` would beat ``OTEL_RESOURCE_ATTRIBUTES``),
    it reads only ``os.environ``, and it keeps an ``OTEL_SERVICE_NAME`` of blanks as the name."""
    attrs: dict[str, str] = {
        sc.SERVICE_NAME: sc.DEFAULT_SERVICE_NAME,
        sc.SERVICE_VERSION: __version__,
    }
    for var, key in sc.K8S_ENV_ATTRIBUTES:
        value = environ.get(var, "").strip()
        if value:
            attrs[key] = value
    attrs.update(_parse_resource_attributes(environ.get(OTEL_RESOURCE_ATTRIBUTES, "")))
    name = environ.get(OTEL_SERVICE_NAME, "").strip()
    if name:
        attrs[sc.SERVICE_NAME] = name
    return attrs


def genai_latest_names(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a comma list, read as the OTel contrib
    instrumentations read it: entries trimmed, case-insensitive) names
    ``gen_ai_latest_experimental``: then the current GenAI metric names are emitted.
    Ours: the SDK does not read it (contrib's ``_semconv`` helper is not a dependency)."""
    env = os.environ if environ is None else environ
    entries = {e.strip().lower() for e in env.get(sc.SEMCONV_OPT_IN_ENV, "").split(",")}
    return sc.SEMCONV_OPT_IN_GEN_AI_LATEST in entries
