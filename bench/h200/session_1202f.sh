#!/usr/bin/env bash
# One device call, 2026-12-02 (sixth): bench/tts_first_use.py on the H200, named voice then cloned:
# which stage and which part of the talker holds a warm c=1 request's first audio back. carry: .whl
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
T0=$(date +%s)
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl > /tmp/pip.log 2>&1
for kind in ${KINDS:-custom_voice base}; do
  PYTHONPATH=/tmp/whl:$PWD timeout ${PROBE_S:-230} python3 bench/tts_first_use.py --out-dir /tmp/fu --kind $kind \
    > "$OUT/first_use_$kind.log" 2>&1
  echo "$kind rc=$?"; grep -E "^(fresh|burst|c=1|kernel|after)|WARNING" "$OUT/first_use_$kind.log" | cut -c1-400; grep -A 22 "slow eager" "$OUT/first_use_$kind.log" | cut -c1-200 | head -80
  cp /tmp/fu/first_use_$kind.json "$OUT/" 2>/dev/null; rm -rf /tmp/fu/qwen3-tts-*
done
echo "session done in $(( $(date +%s) - T0 )) s"
