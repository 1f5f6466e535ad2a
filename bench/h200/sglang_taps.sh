#!/usr/bin/env bash
# Right after final.sh on the same machine: SGLang kit part b and the SGLang GPU tests again (the
# taps test after turning radix caching off with taps). -> $OUT/r6.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1 R=/tmp/r6
mkdir -p $R
SGLKIT_REQUIRE="a b" bash .sglkit/install.sh .sglkit/b > $R/sglkit_b.log 2>&1 || { cat $R/sglkit_b.log; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/.sglkit/shim:/tmp/whl:$PWD
timeout 170 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA -s tests/test_sglang_gpu.py \
  > $R/sglang_tests.log 2>&1; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|sglang engine up|first generate|teacher|tap |pool|Error" $R/sglang_tests.log | tail -30
tar czf $OUT/r6.tgz -C /tmp r6
