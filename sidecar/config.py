"""The one configuration model, and how flags, environment and a YAML file feed it.

Precedence, highest first: command-line flag, ``LLM_SIDECAR_<FLAG>`` environment variable,
``--config`` YAML file, default. Everything is validated once at start; a bad value exits
with one line that names the setting and where it came from (see :func:`load_settings`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from .base.buckets import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from .base.prompt_class import parse_bounds
from .base.tenant import check_tenant_header

__all__ = [
    "Settings",
    "ModelObjectives",
    "ConfigError",
    "load_settings",
    "parse_host_port",
    "ENV_PREFIX",
    "BOOLEAN_WORDS",
    "did_you_mean",
]

ENV_PREFIX = "LLM_SIDECAR_"
MAX_WORKERS = 64
"""The most worker processes ``--workers`` takes (one a core; past this, a pod is too big)."""

# An upstream URL ending in /v1 (or /v2, /v1beta...) is a client's base URL, not a server's
# root: the relayed path already starts with it, so every request would 404 as /v1/v1/...
_API_VERSION_PATH = re.compile(r"/v\d+(?:alpha\d*|beta\d*)?$")
# An API path anywhere in the upstream URL (/v1/chat/completions, Ollama's /api/chat, TGI's
# /generate_stream, llama.cpp's /completion): the part before it is the root.
_API_PATH = re.compile(
    r"/(?:v\d+(?:alpha\d*|beta\d*)?(?:/.*)?|api/(?:chat|generate)|generate(?:_stream)?|completions?)$"
)
# Environment variables the sidecar reads that are not settings.
_OTHER_ENV = {"CONFIG"}


class ConfigError(Exception):
    """A setting is invalid; the message is one line naming it."""


def parse_host_port(value: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``"H:P"``, ``":P"``, ``"P"`` or ``"[v6]:P"`` -> (host, port)."""
    text = str(value).strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif text.isdigit():
        host, port_text = "", text
    else:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be 0-65535, got {port_text!r}")
    return host or default_host, int(port_text)


# A latency SLI reads the histogram bucket at its threshold, so the bucket must exist.
_SLO_BUCKETS = {
    "slo_ttft_seconds": TTFT_BUCKETS,
    "slo_tpot_seconds": ITL_BUCKETS,
    "slo_e2e_seconds": E2E_BUCKETS,
}


class ModelObjectives(BaseModel):
    """One model's default objectives (``slo_model_objectives``), in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_seconds: float | None = Field(None, gt=0, le=86_400)
    tpot_seconds: float | None = Field(None, gt=0, le=86_400)


class Settings(BaseModel):
    """Everything ``llm-sidecar serve`` can be told."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    upstream: str = Field(
        description="Required. Root URL of the inference server, e.g. http://127.0.0.1:8000 (no /v1: "
        "each client's path is relayed as-is; a path given here is a prefix put before it)"
    )
    listen: str = Field("0.0.0.0:8080", description="Proxy address HOST:PORT")
    metrics_listen: str = Field(
        "0.0.0.0:9464",
        description="Admin address HOST:PORT: /metrics, /healthz, /readyz, /upstreamz, "
        "/metrics/engine (its / lists them)",
    )
    workers: int | Literal["auto"] = Field(
        1,
        description="Processes relaying behind the proxy port, each on its own core; 'auto': the "
        "container's CPU limit (its cgroup), else the cores it may run on. Past 1, a supervisor "
        "serves the admin port with one page for the pod (counters summed, never decreasing when "
        "a worker dies) and replaces a worker that exits",
    )
    worker_sync_seconds: float = Field(
        5.0,
        gt=0,
        description="With --workers past 1, how often the supervisor copies every worker's "
        "counts between scrapes and shares the pod's model and tenant label values with every "
        "worker: a worker killed without warning loses at most this much of its counting; "
        "each copy costs a worker a few ms of CPU",
    )
    connect_timeout: float = Field(
        5.0, gt=0, description="Seconds to open a connection to the upstream (else 502 or 504)"
    )
    read_timeout: float = Field(
        600.0,
        gt=0,
        description="Idle seconds allowed between two reads from the upstream (no total timeout)",
    )
    stall_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="Seconds without a byte from the upstream after which a stream in flight "
        "counts as stalled (llm_streams_stalled): longer than a long prompt's prefill before "
        "its first token and an engine's pause to preempt or swap a batch (seconds at most), "
        "far shorter than --read-timeout, which ends a silent stream as an error",
    )
    stall_probe_seconds: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="Serve the admin port's /stallz: 503 when streams are in flight, one has "
        "been silent this long and none made progress or completed meanwhile (a hung engine), "
        "for a liveness probe of the model server (with --workers, the pod's verdict over every "
        "worker's requests). Longer than --stall-seconds. Unset: no /stallz",
    )
    drain_seconds: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM, the longest the sidecar keeps relaying while the upstream answers "
        "and then lets in-flight streams finish (keep it below the pod's "
        "terminationGracePeriodSeconds)",
    )
    health_path: str = Field(
        "/health",
        description="Upstream path whose 2xx makes /readyz ready; also asked by /upstreamz and "
        "the drain",
    )
    readiness_timeout: float = Field(
        2.0, gt=0, description="Seconds a readiness probe of the upstream may take"
    )
    engine_metrics_path: str = Field(
        "/metrics",
        description="The upstream's own metrics path, relayed on the admin port as /metrics/engine "
        "(so Prometheus can scrape a server that listens on loopback); empty turns it off",
    )
    engine_metrics_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds /metrics/engine waits for the upstream (less if the scraper's timeout is shorter)",
    )
    model_allowlist: list[str] = Field(
        default_factory=list,
        description="If set, only these model label values; others become 'other'",
    )
    max_models: int = Field(
        50,
        ge=1,
        description="Distinct model label values kept before new ones become 'other'; a name the "
        "server does not list earns a slot only with an answer that is not a 4xx",
    )
    model_refresh_seconds: float = Field(
        30.0,
        gt=0,
        description="How often the upstream is asked which models it serves (/v1/models, /api/tags, /info); "
        "once it lists them, only those names are model label values",
    )
    label_idle_seconds: float = Field(
        3600.0,
        gt=0,
        description="A model or tenant label value that earned its slot and was unseen this long gives it "
        "back (its series are removed)",
    )
    max_series: int = Field(
        12_000,
        ge=1,
        description="Series budget of /metrics: the page never holds more samples. Counted before a series is "
        "made, every family alike; a new model or tenant value gets its own label only while its series fit, "
        "else 'other' (llm_label_overflow_total, llm_series_refused_total count what did not fit)",
    )
    tenant_header: str | None = Field(
        None,
        description="Opt-in tenant label: the request header naming the tenant (e.g. X-Tenant or an "
        "API-key id header) on requests, tokens, TTFT and goodput. Credential headers "
        "(Authorization, Cookie, X-Api-Key, ...) are refused. Unset: no tenant label anywhere",
    )
    tenant_allowlist: list[str] = Field(
        default_factory=list,
        description="If set, only these tenant label values; others become 'other'",
    )
    max_tenants: int = Field(
        20, ge=1, description="Distinct tenant label values kept before new ones become 'other'"
    )
    max_request_inspect_bytes: int = Field(
        32 << 20,
        ge=0,
        description="Largest JSON request body read to learn its model; larger bodies are streamed unread",
    )
    max_buffered_request_bytes: int = Field(
        64 << 20,
        gt=0,
        description="Request bytes held at once, across all connections, while JSON bodies are read "
        "whole; past it a body is streamed to the upstream as it arrives (its model read in flight)",
    )
    max_response_inspect_bytes: int = Field(
        16 << 20,
        ge=0,
        description="Largest non-streaming JSON response read for its usage; past 64 KiB only a bounded skeleton of it is kept (at most 1 MiB), larger ones are relayed unread",
    )
    max_request_body_bytes: int = Field(
        64 << 20,
        gt=0,
        description="Largest request body relayed; a larger one gets 413 before the upstream is asked "
        "(a declared Content-Length) or as soon as it passes the limit (a chunked body)",
    )
    max_request_line_bytes: int = Field(
        8190, gt=0, description="Longest request line (method, path and query); longer gets 414"
    )
    max_header_field_bytes: int = Field(
        8190, gt=0, description="Longest request header field (name and value); longer gets 431"
    )
    max_request_headers: int = Field(
        128, gt=0, description="Most request header fields; more gets 431"
    )
    max_request_head_bytes: int = Field(
        64 * 1024,
        gt=0,
        description="Largest whole request head (request line and all header fields) on either port; "
        "larger gets 431 (nginx refuses over 32 KiB, Envoy over 60 KiB)",
    )
    client_header_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a client may take to send a request head, and to start the next one on "
        "a kept-alive connection (nginx's client_header_timeout); past it the connection is closed",
    )
    client_body_timeout: float = Field(
        60.0,
        gt=0,
        description="Idle seconds allowed between two reads of a request body; past it 408 (nginx's "
        "client_body_timeout)",
    )
    send_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a client may take no bytes of a response waiting for it (nginx's "
        "send_timeout); past it the upstream request and the client connection are closed. Any "
        "progress restarts it, so a slow but live reader is never cut off",
    )
    max_connections: int = Field(
        0,
        ge=0,
        description="Client connections open at once on the proxy port; more get 503 with Retry-After. "
        "0: the smaller of what the open-files limit allows, (limit - 128) / 2, leaving room "
        "for the upstream sockets, the admin port and the process's own files, and what the "
        "container's memory limit holds, (limit - 128 MiB) / 16 KiB a stream, shared by the "
        "workers (24,576 in the chart's 512Mi); at least 16. A number set is each worker's",
    )
    max_admin_connections: int = Field(
        64,
        ge=0,
        description="Connections open at once on the admin port (probes, scrapes); more get 503 with "
        "Retry-After, so idle admin connections cannot use up the process's open files. 0: no cap",
    )
    max_sse_line_bytes: int = Field(
        1 << 20, gt=0, description="Longest stream line the parser holds"
    )
    slo_ttft_seconds: float = Field(
        2.0, gt=0, description="Goodput: TTFT objective (a bucket bound)"
    )
    slo_tpot_seconds: float = Field(
        0.1, gt=0, description="Goodput: TPOT objective (a bucket bound)"
    )
    slo_e2e_seconds: float = Field(
        60.0, gt=0, description="Goodput: e2e objective (a bucket bound)"
    )
    slo_model_objectives: dict[str, ModelObjectives] = Field(
        default_factory=dict,
        description="Per-model TTFT/TPOT objectives of requests without x-slo-ttft-ms / x-slo-tpot-ms "
        'headers (the SLO spec\'s per-model overrides), e.g. {"my-405b": {"ttft_seconds": 5}}: a YAML '
        "mapping, or JSON in the flag and environment variable. A model not named, or an objective "
        "not given, uses --slo-ttft-seconds / --slo-tpot-seconds",
    )
    ttft_prompt_classes: list[int] = Field(
        default_factory=list,
        description="Input-token bounds of the TTFT histogram's prompt_class label, e.g. 1024,8192 "
        "(classes le1024, le8192, gt8192, unknown when the count is not reported; at most 4 bounds). "
        "Empty: every request is class 'all'",
    )
    log_format: Literal["json", "console"] = Field(
        "json",
        description="Log line format: json (one object a line, for collectors) or console (for a terminal)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="Least severe level logged; failed requests are error lines, served ones info",
    )
    access_log: bool = Field(
        True,
        description="One structured line per request (route, model, status, outcome, stream, "
        "TTFT, TPOT, tokens, duration; never a prompt, a completion or a header)",
    )
    otel_metrics: bool = Field(
        False,
        description="Also export the GenAI client metrics (gen_ai.client.operation.duration, "
        "gen_ai.client.operation.time_to_first_chunk, ...; the current gen_ai.client.inference.* "
        "names with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental) over OTLP; needs OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT. "
        "Traces need no setting: they are on whenever an OTLP endpoint is configured",
    )
    otel_provider_name: str | None = Field(
        None,
        description="gen_ai.provider.name on spans and OTel metrics instead of the API flavour of "
        "the route (openai for /v1/*, anthropic for /v1/messages, ...), e.g. vllm",
    )

    @field_validator("tenant_header", "otel_provider_name", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("tenant_header")
    @classmethod
    def _tenant_header(cls, v: str | None) -> str | None:
        return None if v is None else check_tenant_header(v.strip())

    @field_validator("tenant_allowlist", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        return [m.strip() for m in v.split(",") if m.strip()] if isinstance(v, str) else v

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower_case(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("upstream")
    @classmethod
    def _upstream_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.username is not None or parts.password is not None:
            # Refused, not redacted: the relay never sends URL credentials (each client's own
            # Authorization header goes through), so accepting them would fail quietly. The
            # URL is not echoed: it holds a secret.
            host = parts.hostname or ""
            port = (
                parts.netloc.rpartition("@")[2].rpartition(":")[2]
                if ":" in parts.netloc.rpartition("@")[2]
                else ""
            )
            root = f"{parts.scheme}://{host}{f':{port}' if port else ''}{parts.path.rstrip('/')}"
            raise ValueError(
                "must not hold credentials (user:password@): the sidecar never sends them; clients' "
                f"own Authorization headers are relayed unchanged. Use {root}"
            )
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL with a host, got {v!r}{_with_scheme(v)}")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(f"bad port in {v!r}") from exc
        if parts.query or parts.fragment:
            raise ValueError(
                f"{v!r} has a query string or fragment, which the sidecar would not send; "
                f"give the server's root: {parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
            )
        api = _API_PATH.search(parts.path.rstrip("/"))
        if api and not _API_VERSION_PATH.search(parts.path.rstrip("/")):
            root = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')[: api.start()]}"
            raise ValueError(
                f"{v!r} is an API path; the sidecar relays each client's path as-is, so clients "
                f"would reach {parts.path.rstrip('/')}/v1/chat/completions. Give the server's root instead: {root}"
            )
        if _API_VERSION_PATH.search(parts.path.rstrip("/")):
            root = f"{parts.scheme}://{parts.netloc}{_API_VERSION_PATH.sub('', parts.path.rstrip('/'))}"
            raise ValueError(
                f"{v!r} ends in an API version path (the OpenAI base-URL habit); the sidecar relays "
                f"each client's path as-is, so /v1/chat/completions would go to "
                f"{parts.path.rstrip('/')}/v1/chat/completions. Give the server's root instead: {root}"
            )
        return v.rstrip("/")

    @field_validator("listen", "metrics_listen")
    @classmethod
    def _address(cls, v: str) -> str:
        parse_host_port(v)
        return v

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: int | str) -> int | str:
        if v != "auto" and not 1 <= int(v) <= MAX_WORKERS:
            raise ValueError(f"must be 'auto' or 1 to {MAX_WORKERS}, got {v!r}")
        return v

    @field_validator("health_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must start with '/', got {v!r}")
        return v

    @field_validator("slo_model_objectives", mode="before")
    @classmethod
    def _json_mapping(cls, v: Any) -> Any:
        """The flag and the environment give text: JSON (model names hold ':' and ',')."""
        if isinstance(v, str):
            if not v.strip():
                return {}
            try:
                return json.loads(v)
            except ValueError as exc:
                raise ValueError(
                    f'not JSON ({exc.args[0]}); write e.g. {{"my-model": {{"ttft_seconds": 5}}}}'
                ) from None
        return v

    @field_validator("ttft_prompt_classes", mode="before")
    @classmethod
    def _prompt_classes(cls, v: Any) -> list[int]:
        return parse_bounds(v)

    @field_validator("engine_metrics_path")
    @classmethod
    def _optional_path(cls, v: str) -> str:
        if v and not v.startswith("/"):
            raise ValueError(f"must start with '/', got {v!r}")
        return v

    @field_validator("slo_ttft_seconds", "slo_tpot_seconds", "slo_e2e_seconds")
    @classmethod
    def _threshold_is_bucket(cls, v: float, info: ValidationInfo) -> float:
        buckets = _SLO_BUCKETS[str(info.field_name)]
        if v not in buckets:
            raise ValueError(f"{v} is not a histogram bucket bound; choose one of {list(buckets)}")
        return v

    @field_validator("stall_probe_seconds")
    @classmethod
    def _probe_after_stall(cls, v: float | None, info: ValidationInfo) -> float | None:
        stall = info.data.get("stall_seconds")
        if v is not None and stall is not None and v <= stall:
            raise ValueError(
                f"must be longer than stall_seconds ({stall:g}): the probe restarts an engine, "
                "so it waits longer than the alert"
            )
        return v

    @property
    def listen_addr(self) -> tuple[str, int]:
        return parse_host_port(self.listen)

    @property
    def metrics_addr(self) -> tuple[str, int]:
        return parse_host_port(self.metrics_listen)


def did_you_mean(name: str, valid: list[str]) -> str:
    """``"; did you mean X?"`` naming the closest of ``valid`` to a mistyped ``name``, or ``""``.
    The one suggestion for every source: flags, environment variables and YAML keys. A name
    that begins exactly one valid name (an abbreviation, ``--metrics``) suggests that one."""
    longer = [v for v in valid if v.startswith(name)]
    match = longer if len(longer) == 1 else difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def _with_scheme(value: str) -> str:
    """An address without a scheme (``127.0.0.1:8000``, ``vllm:8000``): the URL meant."""
    text = value.strip()
    if "://" in text or not text:
        return ""
    meant = "http://" + text
    try:
        parts = urlsplit(meant)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return ""
    return f"; did you mean {meant}?" if parts.hostname else ""


BOOLEAN_WORDS = ("true", "false", "1", "0", "yes", "no", "on", "off")
"""How a boolean setting is written in a flag, a variable or the file (any case)."""


def _env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    known = [ENV_PREFIX + n.upper() for n in Settings.model_fields] + [
        ENV_PREFIX + n for n in _OTHER_ENV
    ]
    for key in environ:
        if key.startswith(ENV_PREFIX) and key not in known:
            raise ConfigError(f"unknown environment variable {key}{did_you_mean(key, known)}")
    out: dict[str, Any] = {}
    for name in Settings.model_fields:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            raw = environ[key]
            if name == "model_allowlist":
                out[name] = [m.strip() for m in raw.split(",") if m.strip()]
            else:
                out[name] = raw
    return out


def _file_values(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"--config {path}: not valid YAML{where} ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Settings:
    """Merge the sources and validate; raise :class:`ConfigError` with a one-line message."""
    environ = os.environ if environ is None else environ
    sources: dict[str, str] = {}
    merged: dict[str, Any] = {}
    config_file = config_file or environ.get(ENV_PREFIX + "CONFIG")
    layers: list[tuple[str, dict[str, Any]]] = []
    if config_file:
        layers.append((f"--config {config_file}", _file_values(config_file)))
    layers.append(("environment", _env_values(environ)))
    layers.append(("flag", {k: v for k, v in flags.items() if v is not None}))
    for origin, values in layers:
        for key, value in values.items():
            merged[key] = value
            sources[key] = origin
    try:
        return Settings(**merged)
    except ValidationError as exc:
        # An unknown key first: a misplaced block (``sidecar: {upstream: ...}``) would otherwise
        # read as "upstream is required".
        err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        field = str(err["loc"][0]) if err["loc"] else "settings"
        origin = sources.get(field, "default")
        where = {
            "flag": f"--{field.replace('_', '-')}",
            "environment": ENV_PREFIX + field.upper(),
        }.get(origin, origin)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = f"is required (--{field.replace('_', '-')} or {ENV_PREFIX}{field.upper()})"
            return _raise(f"{field} {msg}")
        if err["type"] == "bool_parsing":
            msg = f"{err['input']!r} is not a boolean; use one of {', '.join(BOOLEAN_WORDS)}"
        if err["type"] == "extra_forbidden":
            valid = list(Settings.model_fields)
            return _raise(f"unknown setting {field!r} in {where}{did_you_mean(field, valid)}")
        return _raise(f"invalid {field} ({where}): {msg}")


def _raise(message: str) -> Settings:
    raise ConfigError(message)
