#!/usr/bin/env bash
# One device call, 2026-12-02 (fourth): the GPU tests after the kernel's tightening (#15: actor,
# supervisor, driver rewritten; cuda_ipc through the actor), then the Qwen3-TTS named voice
# (CustomVoice), which the third call could not start in its short budget: omnid only, c = 1, 16, 64.
# carry: .whl
set -uo pipefail
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
PYTHONPATH=/tmp/whl:$PWD timeout ${GPU_TESTS_S:-200} python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA \
  --continue-on-collection-errors $(grep -l "mark.gpu" tests/*.py) > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -20
left=$(( 575 - ($(date +%s) - T0) ))
TOTAL_S=$left BUDGET_S=$(( left - 25 )) TTS_ARGS="--kinds custom_voice --no-reference --concurrency 1,16,64" \
  bash bench/h200/issue16.sh 2>&1 | grep -E "^\||rc=" | head -20
echo "session done in $(( $(date +%s) - T0 )) s"
