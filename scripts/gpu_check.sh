#!/usr/bin/env bash
# The GPU checks, in one call on a CUDA machine with no network (the lent H100/H200: Python 3.12 and
# torch, but no monarch, torchstore or vLLM). Run from the repository root there, with BUNDLE holding
# what the steering repo's shared/gpu/make_bundle.sh builds (plus pytest-asyncio; add torchtitan==0.3.0,
# spmd_types, tyro and docstring_parser to see why its training path cannot run on an older torch):
#
#   BUNDLE=.gpu bash scripts/gpu_check.sh        # logs also under $OUT when set
#
# It runs the gpu-marked tests and the two GPU benches (bench/weight_sync.py --device cuda,
# bench/trainer_gpu.py); bench/RESULTS.md records what they printed on an H100.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
bundle=${BUNDLE:-.gpu}
out=${OUT:-/tmp/forge_nb_gpu}
mkdir -p "$out" /tmp/site
tar xJf "$bundle/monarch312.tar.xz" -C /tmp/site \
  && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$bundle"/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
python3 -m pytest -p no:cacheprovider -q -rs tests/actors/test_trainer_gpu.py tests/test_weights.py \
  tests/actors/test_titan_parity.py 2>&1 | tee "$out/pytest.log" | tail -8
python3 bench/weight_sync.py --device cuda --mb 1024 --repeats 5 2>&1 | tee "$out/weight_sync.log" | tail -12
python3 bench/trainer_gpu.py 2>&1 | tee "$out/trainer_gpu.log" | tail -9
