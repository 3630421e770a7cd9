"""What the Prometheus Operator makes of rendered PodMonitors and PrometheusRules, for a real
Prometheus with no Kubernetes around it (no kubelet or API server runs on these machines).

Followed, line by line, from the operator's source at one version (and only what the chart's
objects use; anything else is refused, never guessed):

- prometheus-operator/prometheus-operator ``v0.93.0`` (commit
  f8fafd475f3d132e239432ae6172de60a6cb6516), ``pkg/prometheus/promcfg.go``
  (``generateServiceMonitorConfig`` too, with the default ``endpoints`` role):
  ``generatePodMonitorConfig`` (job name ``podMonitor/<ns>/<name>/<i>``, ``honor_labels``, the
  pod role's namespaces from ``namespaceSelector`` else the monitor's own, then the relabelings
  in this order: ``initRelabelings``, ``generateRunningFilter``, a keep per ``matchLabels`` key,
  the port filter, ``namespace``/``container``/``pod``, ``podTargetLabels``, the default job
  ``<monitor namespace>/<monitor name>``, ``jobLabel``, ``endpoint``, the endpoint's own
  relabelings (``generateRelabelConfig``) followed by the enforced namespace label, then
  ``appendShardingRelabelingWithAddress`` with one shard); ``metric_relabel_configs`` = the
  endpoint's metric relabelings plus the enforced namespace label.
- ``pkg/namespacelabeler/labeler.go`` (same commit): ``GetRelabelingConfigs`` appends
  ``{target_label: <enforcedNamespaceLabel>, replacement: <monitor's namespace>}`` last, "to
  ensure it overrides any other relabelings"; ``EnforceNamespaceLabel`` sets that label to the
  PrometheusRule's namespace on every rule and injects ``<label>="<rule namespace>"`` into
  every vector selector of every expression, dropping the selector's own matchers of that
  label (prom-label-proxy's ``injectproxy.EnforceMatchers`` with ``errorOnReplace=false``).

Kubernetes service discovery is replaced by static targets carrying the ``__meta_kubernetes_*``
labels the pod role gives each container port (Prometheus ``discovery/kubernetes/pod.go``), one
per declared port of every pod in the watched namespaces: the operator's own relabelings pick
the monitor's pods and port, as they would in a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

OPERATOR_VERSION = "v0.93.0"
OPERATOR_COMMIT = "f8fafd475f3d132e239432ae6172de60a6cb6516"

_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """promcfg.go ``sanitizeLabelName`` (and the pod role's label names)."""
    return _INVALID_LABEL_CHARS.sub("_", name)


@dataclass(frozen=True)
class Container:
    name: str
    ports: dict[str, str]
    """Port name -> the address a scrape of it reaches here (``127.0.0.1:<port>``)."""
    numbers: dict[str, int] = field(default_factory=dict)
    """Port name -> the containerPort the manifest declares."""
    init: bool = False


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    containers: tuple[Container, ...]
    phase: str = "Running"


def pod_targets(pods: Iterable[Pod], namespaces: Sequence[str] | None) -> list[dict]:
    """The pod role's targets in ``namespaces`` (None: every namespace), as static groups."""
    out = []
    for pod in pods:
        if namespaces is not None and pod.namespace not in namespaces:
            continue
        common = {
            "__meta_kubernetes_namespace": pod.namespace,
            "__meta_kubernetes_pod_name": pod.name,
            "__meta_kubernetes_pod_phase": pod.phase,
            "__meta_kubernetes_pod_ready": "true",
        }
        for key, value in pod.labels.items():
            common[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
            common[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
        for container in pod.containers:
            for port, address in container.ports.items():
                labels = {
                    **common,
                    "__meta_kubernetes_pod_container_name": container.name,
                    "__meta_kubernetes_pod_container_init": str(container.init).lower(),
                    "__meta_kubernetes_pod_container_port_name": port,
                    "__meta_kubernetes_pod_container_port_number": str(
                        container.numbers.get(port, 0)
                    ),
                    "__meta_kubernetes_pod_container_port_protocol": "TCP",
                }
                out.append({"targets": [address], "labels": labels})
    return out


def _relabel_config(rc: dict) -> dict:
    """promcfg.go ``generateRelabelConfig``: the CRD's camelCase fields as Prometheus' keys."""
    known = {
        "sourceLabels",
        "separator",
        "targetLabel",
        "regex",
        "modulus",
        "replacement",
        "action",
    }
    unknown = set(rc) - known
    if unknown:
        raise NotImplementedError(f"relabeling fields not followed here: {sorted(unknown)}")
    out: dict = {}
    if rc.get("sourceLabels"):
        out["source_labels"] = list(rc["sourceLabels"])
    for crd, key in (
        ("separator", "separator"),
        ("targetLabel", "target_label"),
        ("regex", "regex"),
    ):
        if rc.get(crd):
            out[key] = rc[crd]
    if rc.get("modulus"):
        out["modulus"] = rc["modulus"]
    if "replacement" in rc:
        out["replacement"] = rc["replacement"]
    if rc.get("action"):
        out["action"] = rc["action"].lower()
    return out


_SHARDING = [
    # appendShardingRelabelingWithAddress, one shard: the config reloader writes SHARD=0.
    {"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash", "regex": "(.+);", "replacement": "$1", "action": "replace"},
    {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
    {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": "0;|.+;.+", "action": "keep"},
]  # fmt: skip

_ENDPOINT_FIELDS = {
    "port",
    "path",
    "interval",
    "scrapeTimeout",
    "relabelings",
    "metricRelabelings",
    "honorLabels",
    "filterRunning",
}
_SPEC_FIELDS = {
    "selector",
    "namespaceSelector",
    "podMetricsEndpoints",
    "jobLabel",
    "podTargetLabels",
}


def _selector_keeps(spec: dict, role: str) -> list[dict]:
    """A keep per ``matchLabels`` key of the monitor's selector, on the ``role``'s (pod or
    service) labels."""
    keeps = []
    for key in sorted(spec["selector"].get("matchLabels", {})):
        keeps.append({
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_{role}_label_{sanitize(key)}", f"__meta_kubernetes_{role}_labelpresent_{sanitize(key)}"],
            "regex": f"({spec['selector']['matchLabels'][key]});true",
        })  # fmt: skip
    return keeps


def _job_label(spec: dict, role: str) -> list[dict]:
    """``jobLabel``: ``job`` from that label of the ``role`` (pod or service), when set there."""
    if not spec.get("jobLabel"):
        return []
    return [{
        "source_labels": [f"__meta_kubernetes_{role}_label_{sanitize(spec['jobLabel'])}"],
        "target_label": "job", "regex": "(.+)", "replacement": "${1}",
    }]  # fmt: skip


def _endpoint_relabelings(
    cfg: dict, relabel: list[dict], ep: dict, ns: str, enforced_namespace_label: str
) -> dict:
    """What both monitor kinds end an endpoint's scrape job with, in the operator's order:
    the ``endpoint`` label, the endpoint's own relabelings, the enforced namespace label,
    sharding; its metric relabelings, then the enforced namespace label again."""
    if ep.get("port"):
        relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
    enforced = (
        [{"target_label": enforced_namespace_label, "replacement": ns}]
        if enforced_namespace_label
        else []
    )
    relabel += [_relabel_config(rc) for rc in ep.get("relabelings", [])] + enforced
    relabel += _SHARDING
    cfg["relabel_configs"] = relabel
    metric = [_relabel_config(rc) for rc in ep.get("metricRelabelings", [])] + enforced
    if metric:
        cfg["metric_relabel_configs"] = metric
    return cfg


def podmonitor_scrape_configs(
    monitor: dict,
    pods: Iterable[Pod],
    enforced_namespace_label: str = "",
    scrape_interval: str | None = None,
) -> list[dict]:
    """The scrape jobs the operator writes for ``monitor`` (a rendered PodMonitor, its
    ``metadata.namespace`` set), over ``pods`` as the pod role would find them."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    if set(spec) - _SPEC_FIELDS:
        raise NotImplementedError(
            f"PodMonitor fields not followed here: {sorted(set(spec) - _SPEC_FIELDS)}"
        )
    if spec["selector"].get("matchExpressions"):
        raise NotImplementedError("matchExpressions")
    selector = spec["namespaceSelector"] if "namespaceSelector" in spec else {}
    # getNamespacesFromNamespaceSelector: any -> all; matchNames; else the monitor's own.
    namespaces = None if selector.get("any") else (selector.get("matchNames") or [ns])
    pods = list(pods)
    out = []
    for i, ep in enumerate(spec["podMetricsEndpoints"]):
        if set(ep) - _ENDPOINT_FIELDS:
            raise NotImplementedError(
                f"endpoint fields not followed here: {sorted(set(ep) - _ENDPOINT_FIELDS)}"
            )
        cfg: dict = {
            "job_name": f"podMonitor/{ns}/{name}/{i}",
            "honor_labels": bool(ep.get("honorLabels", False)),
        }
        cfg["static_configs"] = pod_targets(
            pods, namespaces
        )  # stands for kubernetes_sd_configs role pod
        if ep.get("interval") or scrape_interval:
            cfg["scrape_interval"] = scrape_interval or ep["interval"]
        if ep.get("scrapeTimeout"):
            cfg["scrape_timeout"] = ep["scrapeTimeout"]
        if ep.get("path"):
            cfg["metrics_path"] = ep["path"]
        relabel: list[dict] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}
        ]
        if ep.get("filterRunning", True):
            relabel.append(
                {
                    "action": "drop",
                    "source_labels": ["__meta_kubernetes_pod_phase"],
                    "regex": "(Failed|Succeeded)",
                }
            )
        relabel += _selector_keeps(spec, "pod")
        if ep.get("port"):
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": ep["port"],
                }
            )
        relabel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ]
        for label in spec.get("podTargetLabels", []):
            relabel.append({
                "source_labels": [f"__meta_kubernetes_pod_label_{sanitize(label)}"],
                "target_label": sanitize(label), "regex": "(.+)", "replacement": "${1}",
            })  # fmt: skip
        relabel.append({"target_label": "job", "replacement": f"{ns}/{name}"})
        relabel += _job_label(spec, "pod")
        out.append(_endpoint_relabelings(cfg, relabel, ep, ns, enforced_namespace_label))
    return out


@dataclass(frozen=True)
class Service:
    name: str
    namespace: str
    labels: dict[str, str]
    selector: dict[str, str]
    ports: tuple[tuple[str, int], ...]
    """(port name, targetPort number) of each port."""


def endpoints_targets(
    services: Iterable[Service], pods: Iterable[Pod], namespaces: Sequence[str] | None
) -> list[dict]:
    """The endpoints role's targets (one per Service port and ready pod it selects), as static groups."""
    pods = list(pods)
    out = []
    for svc in services:
        if namespaces is not None and svc.namespace not in namespaces:
            continue
        common = {
            "__meta_kubernetes_namespace": svc.namespace,
            "__meta_kubernetes_service_name": svc.name,
        }
        for key, value in svc.labels.items():
            common[f"__meta_kubernetes_service_label_{sanitize(key)}"] = value
            common[f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"] = "true"
        for pod in pods:
            if pod.namespace != svc.namespace or not svc.selector.items() <= pod.labels.items():
                continue
            for port_name, number in svc.ports:
                found = [
                    (c, name)
                    for c in pod.containers
                    for name, n in c.numbers.items()
                    if n == number
                ]
                if not found:
                    continue
                container, name = found[0]
                labels = {
                    **common,
                    "__meta_kubernetes_endpoint_port_name": port_name,
                    "__meta_kubernetes_endpoint_port_protocol": "TCP",
                    "__meta_kubernetes_endpoint_ready": "true",
                    "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                    "__meta_kubernetes_endpoint_address_target_name": pod.name,
                    "__meta_kubernetes_pod_name": pod.name,
                    "__meta_kubernetes_pod_phase": pod.phase,
                    "__meta_kubernetes_pod_container_name": container.name,
                    "__meta_kubernetes_pod_container_port_name": name,
                    "__meta_kubernetes_pod_container_port_number": str(number),
                }
                for key, value in pod.labels.items():
                    labels[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
                    labels[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
                out.append({"targets": [container.ports[name]], "labels": labels})
    return out


_SM_SPEC_FIELDS = {
    "selector",
    "namespaceSelector",
    "endpoints",
    "jobLabel",
    "targetLabels",
    "podTargetLabels",
}


def servicemonitor_scrape_configs(
    monitor: dict,
    services: Iterable[Service],
    pods: Iterable[Pod],
    enforced_namespace_label: str = "",
) -> list[dict]:
    """promcfg.go ``generateServiceMonitorConfig`` with the default ``endpoints`` role: job
    ``serviceMonitor/<ns>/<name>/<i>``; keep per Service ``matchLabels``, the port filter,
    ``node``/``pod`` from the address target, ``namespace``, ``service``, ``pod``,
    ``container``, the running filter, the default job (the Service's name), ``jobLabel``,
    ``endpoint``, the endpoint's relabelings and the enforced namespace label, sharding."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    if (
        set(spec) - _SM_SPEC_FIELDS
        or spec["selector"].get("matchExpressions")
        or spec.get("targetLabels")
        or spec.get("podTargetLabels")
    ):
        raise NotImplementedError(f"ServiceMonitor fields not followed here: {sorted(spec)}")
    selector = spec.get("namespaceSelector", {})
    namespaces = None if selector.get("any") else (selector.get("matchNames") or [ns])
    targets = endpoints_targets(services, pods, namespaces)
    out = []
    for i, ep in enumerate(spec["endpoints"]):
        if set(ep) - _ENDPOINT_FIELDS:
            raise NotImplementedError(
                f"endpoint fields not followed here: {sorted(set(ep) - _ENDPOINT_FIELDS)}"
            )
        cfg: dict = {
            "job_name": f"serviceMonitor/{ns}/{name}/{i}",
            "honor_labels": bool(ep.get("honorLabels", False)),
        }
        cfg["static_configs"] = targets
        for crd, key in (
            ("interval", "scrape_interval"),
            ("scrapeTimeout", "scrape_timeout"),
            ("path", "metrics_path"),
        ):
            if ep.get(crd):
                cfg[key] = ep[crd]
        relabel: list[dict] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}
        ]
        relabel += _selector_keeps(spec, "service")
        if ep.get("port"):
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": ep["port"],
                }
            )
        target = [
            "__meta_kubernetes_endpoint_address_target_kind",
            "__meta_kubernetes_endpoint_address_target_name",
        ]
        relabel += [
            {"source_labels": target, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
            {"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        ]  # fmt: skip
        if ep.get("filterRunning", True):
            relabel.append(
                {
                    "action": "drop",
                    "source_labels": ["__meta_kubernetes_pod_phase"],
                    "regex": "(Failed|Succeeded)",
                }
            )
        relabel.append(
            {
                "source_labels": ["__meta_kubernetes_service_name"],
                "target_label": "job",
                "replacement": "${1}",
            }
        )
        relabel += _job_label(spec, "service")
        out.append(_endpoint_relabelings(cfg, relabel, ep, ns, enforced_namespace_label))
    return out


# ----------------------------------------------------------------------- rules


_KEYWORDS = frozenset({
    "and", "or", "unless", "offset", "bool", "inf", "nan", "atan2",
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
})  # fmt: skip
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(
    r"(?:0[xX][0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?:ms|[smhdwy])*(?:[0-9]+(?:ms|[smhdwy]))*"
)
_MATCHER = re.compile(
    r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')\s*'
)


def _string_end(expr: str, i: int) -> int:
    quote = expr[i]
    j = i + 1
    while expr[j] != quote:
        j += 2 if expr[j] == "\\" and quote != "`" else 1
    return j + 1


def _brace_end(expr: str, i: int) -> int:
    j = i + 1
    while expr[j] != "}":
        j = _string_end(expr, j) if expr[j] in "\"'`" else j + 1
    return j + 1


def _enforce_matchers(inner: str, label: str, value: str) -> str:
    """``injectproxy.EnforceMatchers`` (errorOnReplace false, an equality): the selector's own
    matchers of ``label`` are dropped and ``label="value"`` is appended."""
    kept, pos = [], 0
    while pos < len(inner):
        m = _MATCHER.match(inner, pos)
        if m is None:
            raise ValueError(f"cannot read the matchers {{{inner}}}")
        if m.group(1) != label:
            kept.append(f"{m.group(1)}{m.group(2)}{m.group(3)}")
        pos = m.end()
        if pos < len(inner):
            if inner[pos] != ",":
                raise ValueError(f"cannot read the matchers {{{inner}}}")
            pos += 1
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return ",".join([*kept, f'{label}="{escaped}"'])


def enforce_expr(expr: str, label: str, value: str) -> str:
    """``expr`` with ``label="value"`` enforced in every vector and matrix selector, as the
    operator's ``EnforceNamespaceLabel`` does (a PromQL reader for the rules this repo
    generates: selectors, functions, aggregations with label lists, binary operators,
    strings, ranges, subqueries and offsets)."""
    out: list[str] = []
    i, n = 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch in "\"'`":
            j = _string_end(expr, i)
            out.append(expr[i:j])
            i = j
        elif ch == "[":
            j = expr.index("]", i) + 1
            out.append(expr[i:j])
            i = j
        elif ch == "{":  # a selector without a metric name
            j = _brace_end(expr, i)
            out.append("{" + _enforce_matchers(expr[i + 1 : j - 1], label, value) + "}")
            i = j
        elif ch.isdigit() or (ch == "." and i + 1 < n and expr[i + 1].isdigit()):
            m = _NUMBER.match(expr, i)
            assert m is not None and m.end() > i
            out.append(m.group())
            i = m.end()
        elif ch.isalpha() or ch in "_:":
            m = _IDENT.match(expr, i)
            assert m is not None
            word, j = m.group(), m.end()
            k = j
            while k < n and expr[k].isspace():
                k += 1
            if word in _LABEL_LISTS:
                if k < n and expr[k] == "(":
                    j = expr.index(")", k) + 1
                out.append(expr[i:j])
                i = j
            elif word in _KEYWORDS or (k < n and expr[k] == "("):
                out.append(word)  # an operator, an aggregation or a function
                i = j
            elif k < n and expr[k] == "{":
                end = _brace_end(expr, k)
                out.append(
                    word + "{" + _enforce_matchers(expr[k + 1 : end - 1], label, value) + "}"
                )
                i = end
            else:
                out.append(word + "{" + _enforce_matchers("", label, value) + "}")
                i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def enforce_rules(spec: dict, label: str, namespace: str) -> dict:
    """A PrometheusRule's ``spec`` as the operator writes it to Prometheus with
    ``enforcedNamespaceLabel: <label>``, the PrometheusRule being in ``namespace``."""
    groups = []
    for group in spec["groups"]:
        rules = []
        for rule in group["rules"]:
            rule = dict(rule)
            rule["labels"] = {**rule.get("labels", {}), label: namespace}
            rule["expr"] = enforce_expr(str(rule["expr"]), label, namespace)
            rules.append(rule)
        groups.append({**group, "rules": rules})
    return {**spec, "groups": groups}
