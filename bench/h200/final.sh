#!/usr/bin/env bash
# After the fused norm/rope/router kernels, the staged graph inputs and the talker-router finding:
# their GPU tests, thinker decode with fused ops on and off, and the speech serving suite at
# concurrency 1 and 16 against transformers; SGLang kit part a installs in the background. -> $OUT/r5.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1 R=/tmp/r5
mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl || exit 2
export PYTHONPATH=/tmp/whl:$PWD
[ -d .sglkit/a ] && (bash .sglkit/install.sh .sglkit/a > $R/sglkit_a.log 2>&1 &)
timeout 120 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA tests/test_fused_ops.py \
  tests/test_engine_host_path.py tests/test_talker_device_paths.py tests/test_cuda_graphs.py \
  > $R/gpu_tests.log 2>&1; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -30
timeout 50 python3 bench/gpu_decode.py --batch 1,16 --tokens 32 --modes graphs+triton --out $R/decode_fused.json \
  > $R/decode_fused.log 2>&1; tail -4 $R/decode_fused.log
timeout 50 python3 bench/gpu_decode.py --no-fused-ops --batch 1,16 --tokens 32 --modes graphs+triton \
  --out $R/decode_unfused.json > $R/decode_unfused.log 2>&1; tail -4 $R/decode_unfused.log
timeout 150 python3 bench/gpu_suite.py --out-dir $R/suite --concurrency 1,16 --hf-requests 1 --budget-s 145 \
  --hf-reserve-s 40 --hf-limit-s 45 > $R/suite.log 2>&1; tail -22 $R/suite.log
tar czf $OUT/r5.tgz -C /tmp r5
