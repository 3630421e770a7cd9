#!/usr/bin/env bash
# Builds the project's Dockerfile with podman, as CI and the pod tests (tests/pod) use it
# (`make test-image`; `make image` is the plain docker/podman build of the chart's image):
#   scripts/build-image.sh [TAG]      (default tag llm-sidecar:test)
# No registry image can be pulled on these machines, so the Dockerfile's base
# (python:3.11-slim-bookworm) is made from Debian packages: a debootstrap minbase with
# python3 and ca-certificates, cached as a tarball under .tools/ (about a minute cold),
# imported as localhost/python:3.11-slim-bookworm, and passed as the PYTHON_IMAGE build
# argument. The Dockerfile itself is built as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-llm-sidecar:test}
base=localhost/python:3.11-slim-bookworm
cache=${TOOLS_DIR:-.tools}/image
rootfs_tar="$cache/python-bookworm-rootfs.tar"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! podman image exists "$base"; then
  if [ ! -s "$rootfs_tar" ]; then
    mkdir -p "$cache"
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    echo "build-image: debootstrap bookworm -> $rootfs_tar"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    ln -sf python3 "$rootfs/usr/bin/python"
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$rootfs_tar.part" . && mv "$rootfs_tar.part" "$rootfs_tar"
  fi
  podman import --quiet "$rootfs_tar" "$base" >/dev/null
  echo "build-image: imported $base"
fi
podman build --quiet --format docker --network host --build-arg PYTHON_IMAGE="$base" -t "$tag" . >/dev/null
echo "build-image: built $tag"
