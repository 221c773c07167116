#!/usr/bin/env bash
# The GPU check, as run on a lent GPU machine (issue: the GPU path on a real GPU). That machine has a
# Python with torch (CUDA) but no Ray, and nothing can be downloaded there: the runtime's other wheels
# are carried in WHEELS (default build/gpu-wheels; `pip download` them here for its Python, e.g.
#   pip download -d build/gpu-wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 ray==2.60.0 pydantic==2.14.4 google-re2 python-hostlist
# and carry them in parts: ray's wheel is over one call's 64 MiB, so split it and join it here).
# Prints one CHECK line per check (bench/gpu_check.py); exit 1 if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="${WHEELS:-build/gpu-wheels}"
PY="${PYTHON:-python3}"
if ! "$PY" -c "import ray" 2>/dev/null; then
  for part in "$WHEELS"/*.part-aa; do       # a wheel carried in parts: name.whl.part-aa, -ab, ...
    [ -e "$part" ] || continue
    cat "${part%.part-aa}".part-* > "${part%.part-aa}"
  done
  venv=/tmp/raytrain-gpu-venv
  "$PY" -m venv --system-site-packages "$venv"   # the machine's torch stays; Ray and the rest come from WHEELS
  "$venv/bin/pip" install -q --no-index --find-links "$WHEELS" ray pydantic google-re2 python-hostlist
  PY="$venv/bin/python"
fi
echo "gpu_check: $("$PY" -c 'import sys, ray, torch; print(sys.version.split()[0], "ray", ray.__version__, "torch", torch.__version__)')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu_check: /'
PATH="$(dirname "$PY"):$PATH" exec "$PY" bench/gpu_check.py "$@"
