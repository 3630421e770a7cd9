#!/usr/bin/env bash
# One command to bring the Helm chart and everything rendered from it up to date:
# copies deploy/prometheus/*.yaml and dashboards/*.json into helm/llm-sidecar/files/,
# renders deploy/kubernetes/ and the golden renders in tests/golden/helm/, lints the chart.
# `scripts/sync-chart.sh --check` changes nothing and exits 1 when something is stale.
# Details: scripts/sync_chart.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-helm.sh
python=.venv/bin/python
[ -x "$python" ] || python=python3
exec "$python" scripts/sync_chart.py "$@"
