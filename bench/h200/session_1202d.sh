#!/usr/bin/env bash
# One device call, 2026-12-02 (fourth): the GPU tests after the kernel's tightening (#15: actor,
# supervisor, driver rewritten; cuda_ipc through the actor), then the Qwen3-TTS named voice
# (CustomVoice), which the third call could not start in its short budget: omnid only, c = 1, 16, 64.
# carry: .whl
set -uo pipefail
T0=$(date +%s)
bash bench/h200/gpu_tests.sh
left=$(( 575 - ($(date +%s) - T0) ))
TOTAL_S=$left BUDGET_S=$(( left - 25 )) TTS_ARGS="--kinds custom_voice --no-reference --concurrency 1,16,64" \
  bash bench/h200/issue16.sh 2>&1 | grep -E "^\||rc=" | head -20
echo "session done in $(( $(date +%s) - T0 )) s"
