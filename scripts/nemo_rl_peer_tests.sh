#!/usr/bin/env bash
# NeMo RL's own unit tests for its distributed module, run against runtime.nemo_rl with only their
# import lines changed. Nothing of NeMo RL is copied into this project: the test files are read from a
# checkout of NVIDIA-NeMo/RL (the `fetch` tool's mirror by default) into a scratch directory.
#
#   scripts/nemo_rl_peer_tests.sh [NEMO_RL_GIT_DIR] [-- pytest args]
#
# The changes, all to imports (and the mock.patch targets that name the same modules):
#   nemo_rl.distributed.X            -> runtime.nemo_rl.X
#   nemo_rl.data.multimodal_utils    -> runtime.nemo_rl.batched_data_dict (PackedTensor lives there)
#   from nemo_rl.utils.venvs import create_local_venv   -> create_local_venv = None (the Megatron test only)
#   from tests.unit.conftest import TEST_ASSETS_DIR     -> TEST_ASSETS_DIR = None (the same test only)
# A stand-in conftest starts one local Ray (4 CPUs) for the session, as NeMo RL's does.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
REPO=${1:-/work/.mirror/NVIDIA-NeMo+RL/repo}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
PY=${PYTHON:-$HERE/.venv/bin/python}
FILES=(test_batched_data_dict test_named_sharding test_virtual_cluster test_worker_groups)

work=$(mktemp -d -t nemo-rl-peer-XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "NeMo RL at $(git -C "$REPO" rev-parse --short HEAD) ($REPO); tests in $work"
for f in "${FILES[@]}"; do
  git -C "$REPO" show "HEAD:tests/unit/distributed/$f.py" \
    | sed -e 's/nemo_rl\.distributed\./runtime.nemo_rl./g' \
          -e 's/from nemo_rl\.data\.multimodal_utils import/from runtime.nemo_rl.batched_data_dict import/' \
          -e 's/^from nemo_rl\.utils\.venvs import create_local_venv$/create_local_venv = None/' \
          -e 's/^from tests\.unit\.conftest import TEST_ASSETS_DIR$/TEST_ASSETS_DIR = None/' \
    > "$work/$f.py"
  if grep -n "^from nemo_rl\|^import nemo_rl" "$work/$f.py"; then
    echo "error: $f.py still imports nemo_rl at module level (a new import line to map above)" >&2
    exit 2
  fi
done
cat > "$work/conftest.py" <<EOF
import pytest
import ray


@pytest.fixture(scope="session", autouse=True)
def ray_session():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": "$work:$HERE"}})
    yield
    ray.shutdown()
EOF
cd "$work"
PYTHONPATH="$work:$HERE" "$PY" -m pytest -q -p no:cacheprovider -o addopts= --rootdir "$work" "$@" \
  "${FILES[@]/%/.py}" || true
