#!/usr/bin/env bash
# Issue 16: Qwen3-TTS 12Hz-1.7B (random bf16 weights, written here by make_tiny's full-1.7b preset) on one H200:
# omnid over HTTP against the reference package's own generate, same GPU, same run (bench/tts.py):
# c = 1, 8, 16, 64; TTFA, RTF, audio-s/s; a named voice (CustomVoice) and a cloned one (Base, uploaded once);
# omnid's fresh server (first request, voice upload + first use) reported apart from the warm levels.
# carry: .whl (omni's wheels + qwen_tts_hf-0.1.1.post1-py3-none-any.whl + einops-0.8.2-py3-none-any.whl)
#   cp /tmp/qtts/qwen_tts_hf-0.1.1.post1-py3-none-any.whl /opt/pypi/files/einops-0.8.2-py3-none-any.whl .whl/
# librosa is not on the image: the reference's one use of it (mel filters) takes omni's equal ones
# (OMNI_REFERENCE_MEL=omni, tests/qwen3_tts_reference.py). -> $OUT/tts.md, $OUT/tts.json, $OUT/issue16.log
# Environment: TTS_ARGS (more bench/tts.py arguments, e.g. "--kinds custom_voice --no-reference
#   --concurrency 1,16,64"), TOTAL_S (520), BUDGET_S (480), TTS=0 (no bench/tts.py),
#   FIRST_USE="custom_voice base" (first bench/tts_first_use.py for these kinds: which stage and which
#   part of the talker holds a warm c=1 request's first audio back; PROBE_S=230 each ->
#   $OUT/first_use_<kind>.log/.json).
set -uo pipefail
export PYTHONUNBUFFERED=1 OMNI_REFERENCE_MEL=omni HF_HUB_OFFLINE=1
R=${R:-/tmp/r16}
mkdir -p "$R" "$OUT"
if [ ! -d /tmp/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl \
    > "$R/pip.log" 2>&1 || { echo "wheel install failed"; tail -5 "$R/pip.log"; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for kind in ${FIRST_USE:-}; do
  PYTHONPATH=/tmp/whl:$PWD timeout ${PROBE_S:-230} python3 bench/tts_first_use.py --out-dir /tmp/fu --kind $kind \
    > "$OUT/first_use_$kind.log" 2>&1
  echo "first use $kind rc=$?"; grep -E "^(fresh|burst|c=1|kernel|after)|WARNING" "$OUT/first_use_$kind.log" | cut -c1-400
  grep -A 22 "slow eager" "$OUT/first_use_$kind.log" | cut -c1-200 | head -80
  cp /tmp/fu/first_use_$kind.json "$OUT/" 2>/dev/null; rm -rf /tmp/fu/qwen3-tts-*
done
[ "${TTS:-1}" = 0 ] && exit 0
PYTHONPATH=/tmp/whl:$PWD timeout -k 10 ${TOTAL_S:-520} python3 bench/tts.py --out-dir "$R" \
  --budget-s ${BUDGET_S:-480} ${TTS_ARGS:-} > "$R/issue16.log" 2>&1
echo "tts.py rc=$?"
tail -n 30 "$R/issue16.log"
cp "$R/issue16.log" "$OUT/" 2>/dev/null
cp "$R/tts.md" "$R/tts.json" "$OUT/" 2>/dev/null
ls "$R"/omnid-*.log >/dev/null 2>&1 && tail -n 20 "$R"/omnid-*.log > "$OUT/omnid_tails.log"
rm -rf "$R"/qwen3-tts-*  # 2 x ~4.5 GB of random weights
