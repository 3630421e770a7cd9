#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, when they are missing and we can.
# Every test that needs one of these skips locally with a reason, and fails under CI=true.
set -euo pipefail
# nginx: the benchmark's reference proxy (tests/integration/test_bench_smoke.py); prometheus:
# promtool (tests/integration/test_promtool.py) and the server of the alert delivery test,
# prometheus-alertmanager: its Alertmanager (tests/integration/test_alert_delivery.py).
packages=(nginx prometheus prometheus-alertmanager)
missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
elif command -v sudo >/dev/null; then
  sudo apt-get -o DPkg::Lock::Timeout=600 update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
else
  echo "system-deps: missing ${missing[*]} (not root, no sudo); tests that need them will skip" >&2
fi
