#!/usr/bin/env bash
# Install what the toolchain and its tests need on a fresh Debian machine, then the venv.
# Idempotent: re-running skips what is already there.
#
#   bash scripts/setup.sh          everything: build, push, deploy and the tests (torch and ray: ~7.5 GB)
#   bash scripts/setup.sh --light  push and deploy only (a CI runner, a login node): no torch, no ray,
#                                  no Slurm, no debootstrap; the venv is ~51 MB. Needs no root when
#                                  its tools are there; otherwise it names the packages to ask for.
set -euo pipefail
cd "$(dirname "$0")/.."

light=0
case "${1:-}" in
  --light) light=1 ;;
  "") ;;
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup: unknown option ${1} (use --light, or nothing)" >&2; exit 2 ;;
esac

# tool:package. A deploy-only host needs mksquashfs (`deploy --target pyxis --sqsh`); a full one also
# builds (debootstrap), runs the local registry (docker-registry) and the tests' real Slurm.
tools="mksquashfs:squashfs-tools"
[ "$light" -eq 1 ] || tools="$tools docker-registry:docker-registry debootstrap:debootstrap slurmctld:slurm-wlm munged:munge"
found() {  # on PATH, or in the sbin directories an ordinary user's PATH lacks
  command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ] || [ -x "/usr/local/sbin/$1" ]
}
need=()
for pair in $tools; do
  found "${pair%%:*}" || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo"
  else
    echo "setup: missing ${need[*]}; ask an administrator to install them (apt-get install ${need[*]})," >&2
    echo "       then run this again" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  if [ -S /var/run/docker.sock ] && [ ! -w /var/run/docker.sock ]; then
    echo "setup: the Docker engine runs, but $(id -un) may not use /var/run/docker.sock; ask to be added to" >&2
    echo "       the docker group (then log in again), or set DOCKER_HOST to an engine you may use" >&2
  else
    echo "setup: the Docker engine is not reachable; start dockerd (or set DOCKER_HOST)" >&2
  fi
  [ "$light" -eq 1 ] || exit 1   # deploy-only hosts may render without it; build and push need it
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# a venv runs its base interpreter: one under a home directory others cannot enter (pyenv in /root)
# serves only its owner
base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)' 2>/dev/null || echo "")
case "$base" in
  /root/*|/home/*) echo "setup: note: .venv runs $base; other users cannot use it unless they can read that" \
                        "directory (for a shared venv, make it with a system Python: /usr/bin/python3 -m venv .venv)" ;;
esac
if [ "$light" -eq 1 ]; then
  .venv/bin/pip install -q -e .
  echo "setup: ready (.venv, light: push and deploy; the tests need a full setup)"
else
  .venv/bin/pip install -q -e '.[dev]'
  echo "setup: ready (.venv)"
fi
