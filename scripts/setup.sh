#!/usr/bin/env bash
# Install what the toolchain and its tests need on a fresh Debian machine, then the venv.
# Idempotent: re-running skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pair in docker-registry:docker-registry debootstrap:debootstrap mksquashfs:squashfs-tools \
            slurmctld:slurm-wlm munged:munge; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "setup: the Docker engine is not reachable; start dockerd (or set DOCKER_HOST)" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -e '.[dev]'
echo "setup: ready (.venv)"
