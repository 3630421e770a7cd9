"""modelServer.stallProbe: the model server's liveness probe is the sidecar's /stallz, off by
default, with the sidecar told the threshold; readiness and the sidecar's own probes stay
what they are, with one worker or several (the pod's supervisor serves /stallz then); a
render that would give the container two liveness probes is refused."""

from __future__ import annotations

from tests.support.chart import by_kind, render, render_error, require_helm

ON = ("--set", "modelServer.stallProbe.enabled=true")


def containers(*args: str) -> dict[str, dict]:
    require_helm()
    (deployment,) = by_kind(render(*args), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    # The sidecar runs as a native sidecar (an init container that keeps running).
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_off_by_default_the_model_server_has_no_liveness_probe_and_the_sidecar_no_threshold():
    cs = containers()
    assert "livenessProbe" not in cs["model-server"]
    assert "LLM_SIDECAR_STALL_PROBE_SECONDS" not in env(cs["llm-sidecar"])


def test_on_the_model_servers_liveness_asks_stallz_and_the_sidecar_serves_it():
    default = containers()
    cs = containers(*ON, "--set", "modelServer.stallProbe.stallSeconds=600")
    assert cs["model-server"]["livenessProbe"] == {
        "httpGet": {"path": "/stallz", "port": 9464},
        "periodSeconds": 30,
        "timeoutSeconds": 5,
        "failureThreshold": 2,
    }
    assert env(cs["llm-sidecar"])["LLM_SIDECAR_STALL_PROBE_SECONDS"] == "600"
    # Readiness unchanged: the pod still takes traffic by the sidecar's /readyz alone.
    for name in ("model-server", "llm-sidecar"):
        for probe in ("readinessProbe", "startupProbe"):
            assert cs[name].get(probe) == default[name].get(probe), (name, probe)
    assert cs["llm-sidecar"]["livenessProbe"] == default["llm-sidecar"]["livenessProbe"]


def test_with_several_workers_the_probe_and_the_threshold_are_the_same():
    one = containers(*ON, "--set", "sidecar.workers=1")
    two = containers(*ON, "--set", "sidecar.workers=2")
    assert two["model-server"]["livenessProbe"] == one["model-server"]["livenessProbe"]
    assert env(two["llm-sidecar"])["LLM_SIDECAR_WORKERS"] == "2"
    assert env(two["llm-sidecar"])["LLM_SIDECAR_STALL_PROBE_SECONDS"] == "300"


def test_refused_beside_the_upstream_liveness_probe_or_under_a_minute():
    require_helm()
    assert "enable one" in render_error(*ON, "--set", "modelServer.liveness.enabled=true")
    assert "stallSeconds" in render_error(*ON, "--set", "modelServer.stallProbe.stallSeconds=10")
