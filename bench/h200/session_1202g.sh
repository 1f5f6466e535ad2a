#!/usr/bin/env bash
# One device call, 2026-12-02 (seventh), after SDPA leaves out cuDNN (omni/layers/attention.py: cuDNN
# built a plan per new prefill length, 0.7-1.1 s, found by bench/tts_first_use.py): the GPU tests, the
# probe again (named voice), then bench/tts.py (named and cloned, omnid only, c = 1, 16, 64). carry: .whl
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
T0=$(date +%s)
GPU_TESTS_LINES=12 bash bench/h200/gpu_tests.sh
PYTHONPATH=/tmp/whl:$PWD timeout 120 python3 bench/tts_first_use.py --out-dir /tmp/fu --kind custom_voice \
  > "$OUT/first_use_custom_voice.log" 2>&1
echo "probe rc=$?"; grep -E "^(fresh|c=1|kernel)|slow eager" "$OUT/first_use_custom_voice.log" | cut -c1-300
cp /tmp/fu/first_use_custom_voice.json "$OUT/" 2>/dev/null; rm -rf /tmp/fu
left=$(( 570 - ($(date +%s) - T0) ))
TOTAL_S=$left BUDGET_S=$(( left - 20 )) TTS_ARGS="--kinds custom_voice,base --no-reference --concurrency 1,16,64" \
  bash bench/h200/issue16.sh 2>&1 | grep -E "^\||rc=" | head -20
echo "session done in $(( $(date +%s) - T0 )) s"
