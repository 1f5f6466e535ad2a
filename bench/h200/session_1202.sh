#!/usr/bin/env bash
# One device call, 2026-12-02: every `-m gpu` test on main (the #15 layout and shared layers, the
# qwen3_tts GPU tests), then issue17.sh (the Realtime bench) at a shorter budget. carry: .whl
# -> $OUT/gpu_tests.log + issue17.sh's files
set -uo pipefail
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
PYTHONPATH=/tmp/whl:$PWD timeout ${GPU_TESTS_S:-200} python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA tests \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -15
BUDGET=${BUDGET:-330} LEVEL_S=${LEVEL_S:-45} bash bench/h200/issue17.sh
echo "session done in $(( $(date +%s) - T0 )) s"
