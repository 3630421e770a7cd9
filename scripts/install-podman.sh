#!/usr/bin/env bash
# Installs what the pod tests (tests/pod, `make test-pod`) need to build and run the real
# image without a Docker engine: podman, runc and debootstrap from Debian, and the
# containers.conf that makes rootful podman work on these machines (facts in
# ../shared/REAL-PARTS.md: crun refuses the kernel's hybrid cgroups, so runc with the
# cgroupfs manager; the default ulimits exceed the sandbox's, so lower ones).
# Idempotent: installs only missing packages and rewrites the config only when it differs.
set -euo pipefail
packages=(podman runc debootstrap)
missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
    echo "install-podman: missing ${missing[*]} (not root, no sudo); pod tests will skip" >&2
    exit 0
  fi
  # With Recommends: catatonit (kube play's infra container), slirp4netns, buildah.
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    "${missing[@]}" >/dev/null
fi
conf=/etc/containers/containers.conf
want='# Written by llm-sidecar scripts/install-podman.sh (see ../shared/REAL-PARTS.md).
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
'
if [ "$(cat "$conf" 2>/dev/null)" != "$(printf '%s' "$want")" ]; then
  "${sudo[@]}" mkdir -p /etc/containers
  printf '%s' "$want" | "${sudo[@]}" tee "$conf" >/dev/null
  echo "install-podman: wrote $conf"
fi
podman --version
