"""Grafana dashboards as code: the latency overview and the SLO dashboard.

``python -m sidecar.tools.dashboards`` regenerates the committed files from code and from the SLO
spec (``deploy/slo/default.yaml``, the spec the committed rules are rendered from), so the
SLO dashboard's targets, windows and burn-rate thresholds are the alert rules' own:

    dashboards/llm-sidecar-overview.json   latency overview
    dashboards/llm-sidecar-slo.json        SLOs, error budgets, burn rates, alerts
    dashboards/kustomization.yaml          both as ConfigMaps for Grafana's sidecar
                                           (kubectl apply --server-side -k dashboards/)
    helm/llm-sidecar/files/dashboard-templates/*.json
                                           the chart's per-release copies (helm.py)

Built with grafana-foundation-sdk (pinned in pyproject's ``tools`` extra; a generation-time
dependency only, never imported by the running sidecar). Every panel reads the
``datasource`` variable (no ``__inputs``), so the JSON imports as is into Grafana 10 or 11.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..slo.spec import SLOSpec

try:
    from . import overview, slo
    from .helm import TEMPLATE_DIR, chart_templates
    from .render import json_text, kustomization_text, to_json_dict
except ModuleNotFoundError as exc:  # the generator's one dependency is an extra
    if exc.name != "grafana_foundation_sdk":
        raise
    _MISSING = (
        "python -m sidecar.tools.dashboards needs the Grafana SDK, in the tools extra: "
        "pip install 'llm-sidecar-proxy[tools]' (the generated JSON is in dashboards/)"
    )
    if sys.argv[:1] == ["-m"]:  # `python -m sidecar.tools.dashboards`: runpy imports this first
        sys.exit(_MISSING)
    raise ModuleNotFoundError(_MISSING, name=exc.name) from None

__all__ = ["DEFAULT_SPEC", "DASHBOARD_DIR", "KUSTOMIZATION", "build_dashboards", "render_files"]

DEFAULT_SPEC = "deploy/slo/default.yaml"
DASHBOARD_DIR = "dashboards"
KUSTOMIZATION = "dashboards/kustomization.yaml"


def build_dashboards(spec: SLOSpec) -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON data, for an :class:`~sidecar.tools.slo.SLOSpec`."""
    return {
        f"{overview.UID}.json": to_json_dict(overview.build()),
        f"{slo.UID}.json": to_json_dict(slo.build(spec)),
    }


def render_files(spec: SLOSpec) -> dict[str, str]:
    """Repository path -> file text, for every generated file."""
    texts = {name: json_text(data) for name, data in build_dashboards(spec).items()}
    out = {f"{DASHBOARD_DIR}/{name}": text for name, text in texts.items()}
    out[KUSTOMIZATION] = kustomization_text(list(texts))
    # The chart's per-release copies, as Helm templates (helm.py): their own uid and title,
    # and the release's objectives, windows and per-model overrides from its values.
    for name, text in chart_templates(spec, build_dashboards).items():
        out[f"{TEMPLATE_DIR}/{name}"] = text
    return out
