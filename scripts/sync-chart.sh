#!/usr/bin/env bash
# One command to bring everything the Helm chart takes from the repository, or that is rendered
# from it, up to date: copies dashboards/*.json into helm/llm-sidecar/files/dashboards/ (a copy,
# not a link: helm warns about a link on every run), renders the chart's rules
# (helm/llm-sidecar/files/rules/) from deploy/slo/, then deploy/kubernetes/ and the golden
# renders in tests/golden/helm/ from the chart, and lints it. `make generate` runs it after
# the other generators.
# `scripts/sync-chart.sh --check` changes nothing and exits 1 when something is stale.
# Details: scripts/sync_chart.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-helm.sh
python=.venv/bin/python
[ -x "$python" ] || python=python3
exec "$python" scripts/sync_chart.py "$@"
