#!/usr/bin/env bash
# One device call, 2026-12-02 (eighth): Qwen3-Omni's fresh server after SDPA leaves out cuDNN: the cold
# probe (each stage's step seconds for the first 3 requests; 2026-12-01 before: talker 1.90 s and
# code2wav 1.23 s in the 1st request), then cold and warm c=1. No transformers baseline. carry: .whl
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl > /tmp/pip.log 2>&1
PYTHONPATH=/tmp/whl:$PWD timeout ${SUITE_S:-330} python3 bench/gpu_suite.py --out-dir /tmp/cold --concurrency 1 --cold 1 \
  --greedy-levels= --probe-first 3 --no-hf --budget-s $(( ${SUITE_S:-330} - 25 )) > "$OUT/suite.log" 2>&1
echo "suite rc=$?"; tail -30 "$OUT/suite.log" | cut -c1-300
cp /tmp/cold/*.md /tmp/cold/*.json "$OUT/" 2>/dev/null; ls "$OUT"
