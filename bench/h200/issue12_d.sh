#!/usr/bin/env bash
# Issue 12, last call, on main after every merge of the stop: the GPU tests of the sampler and graphs,
# then the serving suite at the server's defaults with the fresh server's first three requests probed
# one at a time (each stage's step seconds per request: where a cold request's time goes).
# carry: .whl   -> $OUT/i12d.tgz + $OUT/suite.md + $OUT/gpu_tests.log
set -uo pipefail
export PYTHONUNBUFFERED=1 R=/tmp/i12d
mkdir -p $R
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl
export PYTHONPATH=/tmp/whl:$PWD
timeout 100 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA tests/test_cuda_graphs.py \
  tests/test_code_predictor_graphs.py tests/test_talker_device_paths.py > $OUT/gpu_tests.log 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu_tests.log | tail -20
timeout 330 python3 bench/gpu_suite.py --out-dir $R/suite --no-hf --label omni-final --budget-s 320 --probe-first 3 \
  --cold 16 --concurrency 1,16,32,64 --greedy-levels= > $R/suite.log 2>&1
grep -E "probe [0-9]" $R/suite.log; grep "^| " $R/suite/suite.md | head -12
cp $R/suite/suite.md $OUT/suite.md 2>/dev/null
tar czf $OUT/i12d.tgz -C /tmp i12d
