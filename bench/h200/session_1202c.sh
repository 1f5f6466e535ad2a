#!/usr/bin/env bash
# One device call, 2026-12-02 (third): issue16.sh (Qwen3-TTS after the GPU fixes), the talker's CUDA
# parity test again, then issue17.sh at context 8192. carry: .whl
set -uo pipefail
T0=$(date +%s)
TOTAL_S=${TTS_S:-230} BUDGET_S=$(( ${TTS_S:-230} - 30 )) bash bench/h200/issue16.sh 2>&1 | grep -E "^\|" | head -40
PYTHONPATH=/tmp/whl:$PWD timeout 90 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider tests/test_qwen3_talker.py \
  > "$OUT/gpu_talker.log" 2>&1; echo "talker gpu tests rc=$?: $(tail -1 "$OUT/gpu_talker.log")"
left=$(( 575 - ($(date +%s) - T0) ))
BUDGET=$(( left - 50 )) LEVEL_S=40 bash bench/h200/issue17.sh 2>&1 | grep -E "^\| (cold|warm)|^- " | head -30
echo "session done in $(( $(date +%s) - T0 )) s"
