#!/usr/bin/env bash
# Install what the toolchain and its tests need on a fresh Debian machine, then the venv.
# Idempotent: re-running skips what is already there.
#
#   bash scripts/setup.sh          everything: build, push, deploy and the tests (torch and ray: ~7.5 GB)
#   bash scripts/setup.sh --light  build, push and deploy only (a CI runner, a login node): no torch,
#                                  no ray, no Slurm; the venv is ~51 MB
set -euo pipefail
cd "$(dirname "$0")/.."

light=0
case "${1:-}" in
  --light) light=1 ;;
  "") ;;
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup: unknown option ${1} (use --light, or nothing)" >&2; exit 2 ;;
esac

tools="docker-registry:docker-registry debootstrap:debootstrap mksquashfs:squashfs-tools"
[ "$light" -eq 1 ] || tools="$tools slurmctld:slurm-wlm munged:munge"   # the tests' real Slurm
need=()
for pair in $tools; do
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
  [ "$light" -eq 1 ] || exit 1   # deploy-only hosts may render without it; build and push need it
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ "$light" -eq 1 ]; then
  .venv/bin/pip install -q -e .
  echo "setup: ready (.venv, light: build, push and deploy; the tests need a full setup)"
else
  .venv/bin/pip install -q -e '.[dev]'
  echo "setup: ready (.venv)"
fi
