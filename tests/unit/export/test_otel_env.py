"""OTLP setup from the standard OTEL_* variables: when it turns on, which exporter, which
resource. The SDK reads its own variables from the process environment, so these tests set
the real environment (monkeypatch) and shut down whatever providers they build."""

from __future__ import annotations

import os
import threading
import time

import pytest

from sidecar import __version__
from sidecar.export import semconv as sc
from sidecar.export.otel_env import (
    genai_latest_names,
    otlp_protocol,
    resource_attributes,
    sdk_disabled,
    wanted_exporters,
)
from sidecar.export.otel_setup import (
    TelemetryProviders,
    _metric_exporter,
    _span_exporter,
    providers_from_env,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("OTEL_", "K8S_")):
            monkeypatch.delenv(name)
    built = []
    yield built
    for providers in built:
        providers.shutdown()


def build(clean_env, **kwargs):
    providers = providers_from_env(**kwargs)
    clean_env.append(providers)
    return providers


def test_nothing_configured_means_no_providers(clean_env):
    providers = build(clean_env, metrics=True)
    assert providers.tracer_provider is None and providers.meter_provider is None
    assert not providers.enabled


def test_endpoint_turns_traces_on_and_metrics_stay_opt_in(clean_env, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    providers = build(clean_env)
    assert providers.tracer_provider is not None and providers.meter_provider is None
    providers = build(clean_env, metrics=True)
    assert providers.tracer_provider is not None and providers.meter_provider is not None


def test_signal_specific_endpoints_and_exporter_variables():
    assert wanted_exporters(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "TRACES"
    ) == {"otlp"}
    assert (
        wanted_exporters(
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "METRICS"
        )
        == set()
    )
    assert wanted_exporters({"OTEL_TRACES_EXPORTER": "otlp"}, "TRACES") == {
        "otlp"
    }  # default endpoint
    assert (
        wanted_exporters(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "none"}, "TRACES"
        )
        == set()
    )
    assert wanted_exporters({"OTEL_TRACES_EXPORTER": "otlp,zipkin"}, "TRACES") == {"otlp"}
    assert wanted_exporters({"OTEL_METRICS_EXPORTER": "console"}, "METRICS") == {"console"}
    assert wanted_exporters({}, "TRACES") == set()


def test_sdk_disabled_wins(clean_env, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not build(clean_env, metrics=True).enabled


@pytest.mark.parametrize(
    ("value", "disabled"),
    [
        ("1", True),
        ("yes", True),
        (" On ", True),
        ("TRUE", True),
        ("false", False),
        ("0", False),
        ("", False),
    ],
)
def test_sdk_disabled_takes_the_usual_spellings_of_true(clean_env, monkeypatch, value, disabled):
    """Ours on purpose: the SDK's own parser takes only "true", so OTEL_SDK_DISABLED=1 would
    leave telemetry on."""
    assert sdk_disabled({"OTEL_SDK_DISABLED": value}) is disabled
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    assert build(clean_env).enabled is not disabled


def test_protocol_selection():
    assert otlp_protocol({}, "TRACES") == "http/protobuf"
    assert otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "TRACES") == "grpc"
    env = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    assert otlp_protocol(env, "TRACES") == "http/protobuf"
    assert otlp_protocol(env, "METRICS") == "grpc"
    assert otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "TRACES") == "http/protobuf"


def test_exporter_classes_follow_the_protocol():
    for env, module in (
        ({}, "opentelemetry.exporter.otlp.proto.http"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "opentelemetry.exporter.otlp.proto.grpc"),
    ):
        spans, metrics = _span_exporter("otlp", env), _metric_exporter("otlp", env)
        try:
            assert type(spans).__module__.startswith(module)
            assert type(metrics).__module__.startswith(module)
        finally:
            spans.shutdown()
            metrics.shutdown()


def test_resource_defaults_kubernetes_and_precedence():
    assert resource_attributes({}) == {
        sc.SERVICE_NAME: "llm-sidecar",
        sc.SERVICE_VERSION: __version__,
    }
    env = {
        "K8S_POD_NAME": "vllm-0",
        "K8S_NAMESPACE_NAME": "inference",
        "K8S_NODE_NAME": "gpu-node-3",
        "K8S_POD_UID": "1234",
        "K8S_CONTAINER_NAME": "",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=prod, k8s.node.name=override,team=a%2Cb,bad",
    }
    attrs = resource_attributes(env)
    assert attrs["k8s.pod.name"] == "vllm-0"
    assert attrs["k8s.namespace.name"] == "inference"
    assert attrs["k8s.pod.uid"] == "1234"
    assert "k8s.container.name" not in attrs
    assert attrs["k8s.node.name"] == "override"  # OTEL_RESOURCE_ATTRIBUTES wins
    assert attrs["team"] == "a,b"  # percent-decoded
    assert attrs["deployment.environment.name"] == "prod"
    assert "bad" not in attrs
    env["OTEL_RESOURCE_ATTRIBUTES"] += ",service.name=from-attrs"
    assert resource_attributes(env)[sc.SERVICE_NAME] == "from-attrs"
    env["OTEL_SERVICE_NAME"] = "from-service-name"
    assert resource_attributes(env)[sc.SERVICE_NAME] == "from-service-name"


def test_the_built_resource_keeps_our_precedence_over_the_sdk_detector(clean_env, monkeypatch):
    """Resource.create also runs the SDK's OTELResourceDetector, whose result sits below the
    attributes handed in: OTEL_RESOURCE_ATTRIBUTES must still beat K8S_* and the defaults, and
    an OTEL_SERVICE_NAME of blanks must not become the name (the SDK's detector keeps it)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("K8S_POD_NAME", "from-downward-api")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=from-attrs,team=a%2Cb")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "   ")
    attributes = build(clean_env).tracer_provider.resource.attributes
    assert attributes["k8s.pod.name"] == "from-attrs"
    assert attributes["team"] == "a,b"
    assert attributes[sc.SERVICE_NAME] == "llm-sidecar"


def test_provider_resource_and_sampler_come_from_the_environment(clean_env, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "sidecar-a")
    monkeypatch.setenv("K8S_POD_NAME", "pod-7")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    provider = build(clean_env).tracer_provider
    assert provider.resource.attributes[sc.SERVICE_NAME] == "sidecar-a"
    assert provider.resource.attributes["k8s.pod.name"] == "pod-7"
    assert provider.resource.attributes["telemetry.sdk.name"] == "opentelemetry"
    assert "0.25" in provider.sampler.get_description()


def test_shutdown_is_bounded_when_the_collector_hangs():
    release = threading.Event()

    class Hanging:
        def shutdown(self):
            release.wait(10)

    class Fine:
        shut = False

        def shutdown(self):
            Fine.shut = True

    started = time.perf_counter()
    assert TelemetryProviders(Hanging(), Fine()).shutdown(timeout=0.2) is False
    assert time.perf_counter() - started < 1.0
    release.set()
    assert TelemetryProviders(Fine(), None).shutdown(timeout=1.0) is True and Fine.shut


@pytest.mark.parametrize(
    ("value", "latest"),
    [
        (None, False),
        ("", False),
        ("gen_ai_latest_experimental", True),
        ("http, GEN_AI_LATEST_EXPERIMENTAL ,database", True),  # a comma list, as contrib reads it
        ("http/dup", False),
        ("gen_ai_latest", False),
        ("gen_ai_latest_experimental_x", False),
    ],
)
def test_semconv_opt_in_is_a_comma_list(value, latest):
    env = {} if value is None else {sc.SEMCONV_OPT_IN_ENV: value}
    assert genai_latest_names(env) is latest


def test_semconv_opt_in_default_reads_the_process_environment(monkeypatch):
    assert genai_latest_names() is False
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    assert genai_latest_names() is True
