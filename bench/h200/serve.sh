#!/usr/bin/env bash
# Call 3, right after call 2 on the same warm machine: omnid's text variant on the built-in engine
# (completes the peer table of call 2), then issue 7's serving suite (omnid speech vs transformers). -> $OUT/r3.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1 R=/tmp/r3
mkdir -p $R
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl
export PYTHONPATH=/tmp/whl:$PWD
timeout 150 python3 bench/sglang_peer.py --out-dir /tmp/peer --systems omni-builtin --budget-s 140 \
  > $R/peer.log 2>&1; tail -12 $R/peer.log
cp /tmp/peer/*.json /tmp/peer/*.md /tmp/peer/*.log $R/ 2>/dev/null
timeout 390 python3 bench/gpu_suite.py --out-dir $R/suite --concurrency 1,4,16,32 --budget-s 370 \
  > $R/suite.log 2>&1; tail -30 $R/suite.log
tar czf $OUT/r3.tgz -C /tmp r3
