#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, when they are missing and we can.
# Every test that needs one of these skips locally with a reason, and fails under CI=true.
set -euo pipefail
# nginx: the benchmark's reference proxy (tests/integration/tools/test_bench_smoke.py); prometheus:
# promtool (tests/integration/tools/test_promtool.py) and the server of the alert delivery test,
# prometheus-alertmanager: its Alertmanager (tests/integration/tools/test_alert_delivery.py); gcc: the
# C extension's build and, through its libgcc dev package, libasan and libubsan for
# make test-sanitizers (scripts/test-sanitizers.sh).
packages=(nginx prometheus prometheus-alertmanager gcc)
missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
# Debian starts a package's daemon when it is installed (nginx on :80, prometheus on :9090,
# alertmanager on :9093): the tests run these as plain processes of their own, so the install
# runs with a policy-rc.d that forbids starting services (exit 101, invoke-rc.d's "action
# forbidden"), removed afterwards, and the units are disabled so a reboot does not start them.
install() {  # $1: "" as root, "sudo" otherwise
  local sudo=$1 policy=${POLICY_RC_D:-/usr/sbin/policy-rc.d} had_policy=0  # POLICY_RC_D: for its test
  [ -e "$policy" ] && had_policy=1
  if [ "$had_policy" -eq 0 ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod 755 "$policy"
    trap "$sudo rm -f $policy" EXIT
  fi
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    for unit in nginx prometheus prometheus-alertmanager; do
      $sudo systemctl disable --now "$unit" >/dev/null 2>&1 || true
    done
  fi
}
if [ "$(id -u)" -eq 0 ]; then
  install ""
elif command -v sudo >/dev/null; then
  install sudo
else
  echo "system-deps: missing ${missing[*]} (not root, no sudo); tests that need them will skip" >&2
fi
