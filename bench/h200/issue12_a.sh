#!/usr/bin/env bash
# Issue 12, call 1: the GPU tests of the one sampler (sampled graphs == sampled eager, nothing
# captured after start-up, the code predictor's sampled graph), then the speech serving suite at
# the server's own sampling (cold levels on the fresh server, then warm 1,4,16,32,64, greedy as an
# extra line), omnid's default --mps auto. SGLang kit part a installs in the background.
# carry: .whl .sglkit/a .sglkit/install.sh   -> $OUT/i12a.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1 R=/tmp/i12a
mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl || exit 2
export PYTHONPATH=/tmp/whl:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
echo "mps control: $(command -v nvidia-cuda-mps-control || echo none)" | tee -a $R/gpu.txt
[ -d .sglkit/a ] && (bash .sglkit/install.sh .sglkit/a > $R/sglkit_a.log 2>&1 &)
timeout 130 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA tests/test_cuda_graphs.py \
  tests/test_code_predictor_graphs.py tests/test_fused_ops.py tests/test_talker_device_paths.py \
  > $R/gpu_tests.log 2>&1; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -40
timeout 400 python3 bench/gpu_suite.py --out-dir $R/suite --no-hf --label omni-mps-auto --budget-s 390 \
  --greedy-levels 16 > $R/suite.log 2>&1; tail -45 $R/suite.log
grep -hE "decode graphs|code predictor: .* graphs|MPS|captured after" $R/suite/omnid.log | head -20
tar czf $OUT/i12a.tgz -C /tmp i12a
