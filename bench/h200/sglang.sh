#!/usr/bin/env bash
# On the machine where SGLang kit part a was installed by the previous call: part b, the SGLang
# GPU tests, then SGLang alone and omnid on the SGLang backend for the peer table (SGLang alone as its
# offline Engine: its HTTP server does not import on this image). -> $OUT/r2.tgz
# carry: .whl .sglkit/b .sglkit/install.sh .sglkit/shim
# Environment: PEER=0 (the GPU tests only), R (/tmp/r2), TGZ (r2.tgz).
# Old calls: sglang_taps.sh (after final.sh) = PEER=0 R=/tmp/r6 TGZ=r6.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 R=${R:-/tmp/r2}
OUT=${OUT:-$(mktemp -d /tmp/sglang-out.XXXX)}
mkdir -p $R
SGLKIT_REQUIRE="a b" bash .sglkit/install.sh .sglkit/b > $R/sglkit_b.log 2>&1 || { cat $R/sglkit_b.log; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/.sglkit/shim:/tmp/whl:$PWD
timeout 170 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA -s tests/test_sglang_gpu.py \
  > $R/sglang_tests.log 2>&1; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|sglang engine up|first generate|teacher|tap |pool|Error" $R/sglang_tests.log | tail -30
if [ "${PEER:-1}" != 0 ]; then
  timeout 370 python3 bench/sglang_peer.py --out-dir /tmp/peer --systems sglang,omni-sglang --budget-s 360 \
    > $R/peer.log 2>&1; tail -25 $R/peer.log
  cp /tmp/peer/*.json /tmp/peer/*.md /tmp/peer/*.log $R/ 2>/dev/null
fi
tar czf "$OUT/${TGZ:-r2.tgz}" -C "$(dirname $R)" "$(basename $R)"
