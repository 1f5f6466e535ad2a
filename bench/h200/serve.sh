#!/usr/bin/env bash
# omnid's text variant on the built-in engine (the peer table's omni-builtin row), then issue 7's
# serving suite (omnid speech, full size, vs transformers), with SGLang kit part a installing in
# the background for the next call (when carried). carry: .whl [.sglkit/a .sglkit/install.sh] -> $OUT/r3.tgz
# (For the suite without transformers, MPS variants, cold/probe runs and the equal-work table: issue12.sh.)
# Environment: PEER=0 (skip the omni-builtin row), SUITE_ARGS ("--concurrency 1,4,16,32 --budget-s 350"),
#   SUITE_S (370: the suite's time limit), R (/tmp/r3), TGZ (r3.tgz).
# Old calls: final.sh's suite = PEER=0 SUITE_S=150 SUITE_ARGS="--concurrency 1,16 --hf-requests 1 --budget-s 145
#   --hf-reserve-s 40 --hf-limit-s 45" (its GPU tests and decode runs: kernels.sh PARTS=tests,decode).
set -uo pipefail
export PYTHONUNBUFFERED=1 R=${R:-/tmp/r3}
OUT=${OUT:-$(mktemp -d /tmp/serve-out.XXXX)}
mkdir -p $R
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl
export PYTHONPATH=/tmp/whl:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
[ -d .sglkit/a ] && (bash .sglkit/install.sh .sglkit/a > $R/sglkit_a.log 2>&1 &)
if [ "${PEER:-1}" != 0 ]; then
  timeout 160 python3 bench/sglang_peer.py --out-dir /tmp/peer --systems omni-builtin --budget-s 150 \
    > $R/peer.log 2>&1; tail -12 $R/peer.log
  cp /tmp/peer/*.json /tmp/peer/*.md /tmp/peer/*.log $R/ 2>/dev/null
fi
# shellcheck disable=SC2086
timeout ${SUITE_S:-370} python3 bench/gpu_suite.py --out-dir $R/suite ${SUITE_ARGS:---concurrency 1,4,16,32 --budget-s 350} \
  > $R/suite.log 2>&1; tail -40 $R/suite.log
tar czf "$OUT/${TGZ:-r3.tgz}" -C "$(dirname $R)" "$(basename $R)"
