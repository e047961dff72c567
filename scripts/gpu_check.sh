#!/usr/bin/env bash
# The GPU checks, in one call on a CUDA machine with no network (the lent H100/H200: Python 3.12 and
# torch, but no monarch, torchstore or vLLM). Run from the repository root there, with BUNDLE holding
# what the steering repo's shared/gpu/make_bundle.sh builds (plus pytest-asyncio; add torchtitan==0.3.0,
# spmd_types, tyro and docstring_parser to see why its training path cannot run on an older torch):
#
#   BUNDLE=.gpu bash scripts/gpu_check.sh        # logs also under $OUT when set; give the call ~560 s
#
# It runs the CUDA tests (tests/actors/test_trainer_gpu.py, the gpu-marked cases of tests/test_weights.py and
# tests/test_spawn_errors.py: their CPU cases run in CI, and each store start costs ~8 s on that machine;
# tests/actors/test_titan_parity.py)
# and the two GPU benches (bench/weight_sync.py --device cuda, bench/trainer_gpu.py), each under a time limit
# of its own so that one hang cannot eat the others' time; bench/RESULTS.md records what they printed.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
bundle=${BUNDLE:-.gpu}
out=${OUT:-/tmp/forge_nb_gpu}
mkdir -p "$out" /tmp/site
tar xJf "$bundle/monarch312.tar.xz" -C /tmp/site \
  && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$bundle"/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
} 2>&1 | tee "$out/env.log"
step() {  # step SECONDS LOG COMMAND...: run it under a limit, log it whole, show its end
  local limit=$1 log=$2; shift 2
  timeout -k 10 "$limit" "$@" > "$out/$log" 2>&1
  echo "rc=$? ($*)" >> "$out/$log"
  tail -14 "$out/$log"
}
step 150 pytest_gpu.log python3 -m pytest -p no:cacheprovider -q -rs tests/actors/test_trainer_gpu.py \
  tests/actors/test_titan_parity.py
step 120 pytest_weights_gpu.log python3 -m pytest -p no:cacheprovider -q -rs -m gpu tests/test_weights.py \
  tests/test_spawn_errors.py
step 120 weight_sync.log python3 bench/weight_sync.py --device cuda --mb 1024 --repeats 5
step 120 trainer_gpu.log python3 bench/trainer_gpu.py
