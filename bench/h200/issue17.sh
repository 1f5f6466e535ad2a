#!/usr/bin/env bash
# Issue 17 (voice conversations), one device call: a fresh omnid on the full-size Qwen3-Omni with random
# bf16 weights (bench/gpu_suite.py's settings, KV 4096 blocks, MPS as OMNID_ARGS says) under
# bench/realtime.py: spoken 10-turn sessions over /v1/realtime at real-time pace, the fresh server's
# level 1 first (cold), a 2-turn warm-up, then the warm levels 1, 8, 32 at the server's own turn
# detection (server_vad, silence_duration_ms 500: what users get), then, if time is left, 8 sessions
# with silence_duration_ms 200 set by the client (reported apart). No level starts a turn after
# LEVEL_S seconds (the table says turns done / planned). Whole script < 9 minutes.
# carry: .whl (with silero_vad-6.2.3-py3-none-any.whl in it)   -> $OUT/realtime.md, realtime.json, realtime_short.md, realtime_short.json, i17.tgz, issue17.log
# Context 8192 (RT_SETS): ten turns of these sessions pass 4096 tokens (on 2026-12-02 turns 9-10 were refused at 4096).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
OUT=${OUT:-$(mktemp -d /tmp/issue17-out.XXXX)}
R=${R:-/tmp/i17}
rm -rf "$R"; mkdir -p "$R" "$OUT"
LOG="$R/issue17.log"
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
# .whl: omni's wheels plus silero-vad (the server VAD's model; --no-deps: omni loads its JIT file itself)
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/whl/silero_vad ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl \
    >> "$LOG" 2>&1 || say "wheel install failed (see log)"
fi
export PYTHONPATH=/tmp/whl:$PWD${PYTHONPATH:+:$PYTHONPATH}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
python3 -c "import silero_vad, soxr, soundfile, aiohttp" 2>>"$LOG" || say "a package the Realtime API needs is missing (see log)"
BUDGET=${BUDGET:-480}   # the suite: omnid start + every level + stop
LEVEL_S=${LEVEL_S:-50}  # per level: no new turn after it
SHORT=(); [ -n "${SHORT_MS-200}" ] && SHORT=(--short-silence-ms "${SHORT_MS-200}" --short-sessions 8)  # SHORT_MS= : none
SCALED_ARG=(); [ "${SCALED:-0}" = 1 ] && SCALED_ARG=(--scaled)
OMNID=(); for a in ${OMNID_ARGS:---mps=on}; do OMNID+=("--omnid-arg=$a"); done
cmd=(python3 bench/realtime_suite.py --out-dir "$R/suite" --sessions "${SESSIONS:-1,8,32}" --cold 1 --budget-s "$BUDGET"
     "${SHORT[@]}" "${SCALED_ARG[@]}" "${OMNID[@]}" ${RT_SETS---set thinker.args.max_model_len=8192 --set talker.args.max_model_len=8192 --set preprocess.args.max_prompt_tokens=8192}
     -- --turns "${TURNS:-10}" --level-deadline-s "$LEVEL_S" ${BENCH_ARGS:-})
say "${cmd[*]}"
timeout -k 45 $(( BUDGET + 30 )) "${cmd[@]}" > "$R/suite.log" 2>&1
say "suite rc=$?"
grep -E "level|turns ok|warm-up|omnid_start|realtime" "$R/suite.log" | tail -30 | tee -a "$LOG"
for f in realtime.md realtime.json realtime_short.md realtime_short.json; do
  [ -f "$R/suite/$f" ] && cp "$R/suite/$f" "$OUT/$f"
done
[ -f "$R/suite/realtime.md" ] && grep -E "^\| (cold|warm)|^- " "$R/suite/realtime.md" | tee -a "$LOG"
[ -f "$R/suite/realtime_short.md" ] && grep -E "^\| (cold|warm)|^- |^Turn detection" "$R/suite/realtime_short.md" | tee -a "$LOG"
say "done in $(( $(date +%s) - T0 ))s"
cp "$LOG" "$OUT/issue17.log"
find "$R" -type f -size +4M -name '*.log' | while read -r f; do tail -c 4M "$f" > "$f.tail" && mv "$f.tail" "$f"; done
tar czf "$OUT/i17.tgz" -C "$(dirname "$R")" "$(basename "$R")"
ls -la "$OUT"
