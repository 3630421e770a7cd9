#!/usr/bin/env bash
# Installs aiperf (NVIDIA's load generator, from PyPI) into the repo-local venv .tools/aiperf-venv
# (gitignored), for the live load-generator tests in tests/real/ and the benchmarks: an
# independent client that measures TTFT/ITL itself and counts its own successes.
#
# Recipe: a venv of its own (aiperf pins its own pydantic/transformers versions); no torch is
# needed (the tokenizer is loaded with `tokenizers`/`transformers` only). It needs no network
# when `--tokenizer` is a local folder (the tiny model, .tools/models/tiny-llama, built by
# scripts/install-vllm.sh). Do NOT set HF_HUB_OFFLINE=1: aiperf 0.13 then looks every
# tokenizer name up as a Hub cache entry and refuses a local path (HFValidationError).
# A stamp file makes reruns instant; a changed AIPERF_VERSION reinstalls.
# Usage: scripts/install-aiperf.sh          (idempotent; `make real-servers` runs it)
#        then .tools/aiperf-venv/bin/aiperf profile --help
set -euo pipefail
cd "$(dirname "$0")/.."

AIPERF_VERSION=${AIPERF_VERSION:-0.13.0}
PYTHON=${PYTHON:-python3}
TOOLS_DIR=${TOOLS_DIR:-.tools}
venv="$TOOLS_DIR/aiperf-venv"
stamp="$venv/.installed-aiperf-$AIPERF_VERSION"
started=$(date +%s)

if [ -f "$stamp" ]; then
  echo "install-aiperf: cached ($venv, aiperf $AIPERF_VERSION)"
  exit 0
fi

rm -rf "$venv"
"$PYTHON" -m venv "$venv"
# The machine's pip.conf names local index folders that miss most packages: one warning each.
pip_quiet() { "$venv/bin/pip" "$@" 2> >(grep -v "WARNING: Location" >&2); }
pip_quiet install -q --disable-pip-version-check --upgrade pip
pip_quiet install -q --disable-pip-version-check "aiperf==$AIPERF_VERSION"
# The check that fails when the install went wrong (a missing or broken entry point).
"$venv/bin/aiperf" --help >/dev/null
"$venv/bin/python" -c "import importlib.metadata as m; print('install-aiperf: aiperf', m.version('aiperf'))"
touch "$stamp"
echo "install-aiperf: done in $(( $(date +%s) - started )) s -> $venv ($(du -sh "$venv" | cut -f1))"
