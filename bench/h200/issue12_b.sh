#!/usr/bin/env bash
# Issue 12, call 2: the GPU tests that a concurrent capture broke in call 1 (inline mode's stages set up
# at once), then the serving suite at the server's defaults with omnid's --mps on (the default auto).
# SGLang kit part a installs in the background for call 3 (issue12.sh PARTS=serve,sglang, --mps=off).
# carry: .whl .sglkit/a .sglkit/install.sh   -> $OUT (issue12.sh's files) + $OUT/gpu_tests.log
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl || exit 2
PYTHONPATH=/tmp/whl:$PWD timeout 110 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA \
  tests/test_cuda_graphs.py tests/test_code_predictor_graphs.py tests/test_fused_ops.py > $OUT/gpu_tests.log 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu_tests.log | tail -30
PARTS=serve SERVE_LABEL=omni-mps OMNID_ARGS="--mps=on" SERVE_BUDGET=420 TOTAL_S=470 bash bench/h200/issue12.sh
