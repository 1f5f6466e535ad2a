#!/usr/bin/env bash
# omnid's text variant on the built-in engine (the peer table's omni-builtin row), then issue 7's
# serving suite (omnid speech, full size, vs transformers), with SGLang kit part a installing in
# the background for the next call. -> $OUT/r3.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1 R=/tmp/r3
mkdir -p $R
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl
export PYTHONPATH=/tmp/whl:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
[ -d .sglkit/a ] && (bash .sglkit/install.sh .sglkit/a > $R/sglkit_a.log 2>&1 &)
timeout 160 python3 bench/sglang_peer.py --out-dir /tmp/peer --systems omni-builtin --budget-s 150 \
  > $R/peer.log 2>&1; tail -12 $R/peer.log
cp /tmp/peer/*.json /tmp/peer/*.md /tmp/peer/*.log $R/ 2>/dev/null
timeout 370 python3 bench/gpu_suite.py --out-dir $R/suite --concurrency 1,4,16,32 --budget-s 350 \
  > $R/suite.log 2>&1; tail -40 $R/suite.log
tar czf $OUT/r3.tgz -C /tmp r3
