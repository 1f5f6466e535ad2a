#!/usr/bin/env bash
# One device call, 2026-12-02 (fifth): where the named voice's c=1 TTFA tail comes from (p50 158 ms,
# p90 908 ms in call 6): bench/tts.py now records every request's TTFA; three c=1 levels in a row
# after the warm burst, then c=16, named voice and cloned voice, omnid only. carry: .whl
set -uo pipefail
T0=$(date +%s)
TOTAL_S=${TTS_S:-400} BUDGET_S=$(( ${TTS_S:-400} - 25 )) \
  TTS_ARGS="--kinds custom_voice,base --no-reference --concurrency 1,1,1,16" \
  bash bench/h200/issue16.sh 2>&1 | grep -E "^\||rc=" | head -20
python3 - "$OUT/tts.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r.get("kind"), r.get("phase"), r.get("concurrency"), r.get("ttfa_ms_each"),
          (r.get("second_request") or {}).get("ttfa_ms_each", ""))
PY
echo "session done in $(( $(date +%s) - T0 )) s"
