#!/usr/bin/env bash
# One command to bring everything rendered from the Helm chart up to date: renders the
# chart's rules (helm/llm-sidecar/files/rules/) from deploy/slo/, then deploy/kubernetes/ and
# the golden renders in tests/golden/helm/ from the chart, and lints it. It copies nothing:
# files/dashboards is a link to dashboards/. `make generate` runs it after the other generators.
# `scripts/sync-chart.sh --check` changes nothing and exits 1 when something is stale.
# Details: scripts/sync_chart.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-helm.sh
python=.venv/bin/python
[ -x "$python" ] || python=python3
exec "$python" scripts/sync_chart.py "$@"
