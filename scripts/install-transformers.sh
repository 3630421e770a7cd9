#!/usr/bin/env bash
# Installs Hugging Face `transformers serve` into the repo-local venv .tools/transformers-venv
# (gitignored), for the live tests in tests/real/: a third real OpenAI-compatible server,
# whose chat streams end with a finish_reason + usage chunk and never send `data: [DONE]`.
#
# Recipe (docs: /work/shared/REAL-PARTS.md):
# - torch==2.13.0 FIRST: the machine's local wheel (+cpu) is picked; `transformers[serving]`
#   installed first would pull a CUDA torch from the index.
# - transformers[serving]==5.23.0 (fastapi, uvicorn, openai ... for `transformers serve`).
# - It serves the tiny model built by scripts/install-vllm.sh (.tools/models/tiny-llama),
#   offline: HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=<dir with an empty hub/>
#   (/v1/models answers 500 without HF_HOME/hub).
# A stamp file makes reruns instant; a changed version reinstalls.
# Usage: scripts/install-transformers.sh   (idempotent; `make real-servers` runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
TRANSFORMERS_VERSION=${TRANSFORMERS_VERSION:-5.23.0}
PYTHON=${PYTHON:-python3}
TOOLS_DIR=${TOOLS_DIR:-.tools}
venv="$TOOLS_DIR/transformers-venv"
stamp="$venv/.installed-transformers-$TRANSFORMERS_VERSION-torch-$TORCH_VERSION"
started=$(date +%s)

if [ -f "$stamp" ]; then
  echo "install-transformers: cached ($venv, transformers $TRANSFORMERS_VERSION)"
  exit 0
fi

rm -rf "$venv"
"$PYTHON" -m venv "$venv"
# The machine's pip.conf names local index folders that miss most packages: one warning each.
pip_quiet() { "$venv/bin/pip" "$@" 2> >(grep -v "WARNING: Location" >&2); }
pip=(pip_quiet install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" "torch==$TORCH_VERSION"
"$venv/bin/python" - <<PY
import torch, sys
if "+cpu" not in torch.__version__:
    sys.exit(f"install-transformers: torch {torch.__version__} is not the CPU build (want $TORCH_VERSION+cpu)")
PY
"${pip[@]}" "transformers[serving]==$TRANSFORMERS_VERSION"
# torch must still be the CPU build the local wheel gave (a dependency could have replaced it).
"$venv/bin/python" -c "import torch, sys; sys.exit(0 if '+cpu' in torch.__version__ else 'install-transformers: torch was replaced')"
"$venv/bin/transformers" serve --help >/dev/null
"$venv/bin/python" -c "import transformers, torch; print('install-transformers: transformers', transformers.__version__, 'torch', torch.__version__)"
touch "$stamp"
echo "install-transformers: done in $(( $(date +%s) - started )) s -> $venv ($(du -sh "$venv" | cut -f1))"
