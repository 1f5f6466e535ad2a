#!/usr/bin/env bash
# Issue 26 (spoken conversations that stay fast), one device call: omnid as the README's GPU command
# starts it (presets_full: Qwen3-Omni-30B-A3B at full size, random bf16 weights drawn on the GPU;
# `omnid serve --model DIR --device cuda --dtype bfloat16`, context 8192 for ten turns) under
# bench/realtime.py: sessions of 10 spoken turns (1-2 s clips at real-time pace, answers of 24 thinker
# tokens + 48 talker frames with ignore_eos, the issue's workload), every level twice: manual commit
# (turn detection off: commit -> first audio is the server's part) and the server's own VAD (end of
# speech -> first audio as users get it). Cold level 1 first, a 2-turn warm-up, then warm 1, 8, 32.
# Per turn p50/p90 over sessions from commit and from end of speech, turn 10 vs turn 2, the thinker's and
# talker's prefix-cache and the audio encoder's cache hit rates, the issue's targets checked.
# carry: .whl (omni's wheels with silero_vad-6.2.3-py3-none-any.whl)
#   -> $OUT/realtime26.md, realtime26.json, realtime26.log, omnid_tail.log, metrics.txt, r26.tgz
# Environment: SESSIONS (1,8,32), COLD (1), TURNS (10), LEVEL_TURNS (32=6: fewer turns at a level),
#   LEVEL_S (30: no session starts a turn after it, per level), COMMIT (manual,vad), TOTAL_S (560),
#   KV (4096: thinker and talker KV blocks of 16 tokens; the engine's default, 256, is 4096 tokens for
#   every session together: 8 ten-turn conversations do not fit and the prefix cache evicts them;
#   KV= keeps the default),
#   START_S (240: omnid healthy within), OMNID_ARGS (extra `omnid serve` words), BENCH_ARGS (more
#   bench/realtime.py arguments), SCALED=1 (a CPU dry run: presets_full --scaled, --device cpu).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
T0=$(date +%s)
OUT=${OUT:-$(mktemp -d /tmp/r26-out.XXXX)}
R=${R:-/tmp/r26}
rm -rf "$R"; mkdir -p "$R" "$OUT"
LOG="$R/realtime26.log"
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( ${TOTAL_S:-560} - ($(date +%s) - T0) )); }
# .whl: omni's wheels plus silero-vad (the server VAD's model; --no-deps: omni loads its JIT file itself)
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/whl/silero_vad ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl \
    >> "$LOG" 2>&1 || say "wheel install failed (see log)"
fi
export PYTHONPATH=/tmp/whl:$PWD${PYTHONPATH:+:$PYTHONPATH}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
python3 -c "import silero_vad, soxr, soundfile, aiohttp" 2>>"$LOG" || say "a package the Realtime API needs is missing (see log)"

if [ "${SCALED:-0}" = 1 ]; then scaled=(--scaled) device=(--device cpu); else scaled=() device=(--device cuda --dtype bfloat16); fi
python3 -m omni.models.qwen3_omni.checkpoint.presets_full "$R/q3o" "${scaled[@]}" >> "$LOG" 2>&1 || say "presets_full failed"
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
URL="http://127.0.0.1:$PORT"
KVB=${KV-4096}; kv=(); [ -n "$KVB" ] && kv=(--set "thinker.args.num_blocks=$KVB" --set "talker.args.num_blocks=$KVB")
# shellcheck disable=SC2086
omnid=(python3 -m omni.api.cli serve --model "$R/q3o" "${device[@]}" --port "$PORT"
       --set thinker.args.max_model_len=8192 --set talker.args.max_model_len=8192
       --set preprocess.args.max_prompt_tokens=8192 "${kv[@]}" ${OMNID_ARGS:-})
say "${omnid[*]}"
setsid "${omnid[@]}" > "$R/omnid.log" 2>&1 &
OMNID_PID=$!
stop_omnid() {
  kill -TERM -- "-$OMNID_PID" 2>/dev/null
  for _ in $(seq 30); do kill -0 "$OMNID_PID" 2>/dev/null || return 0; sleep 1; done
  kill -KILL -- "-$OMNID_PID" 2>/dev/null
}
trap stop_omnid EXIT
healthy=0
for _ in $(seq "${START_S:-240}"); do
  if python3 -c "import urllib.request as u; u.urlopen('$URL/health', timeout=2)" 2>/dev/null; then healthy=1; break; fi
  kill -0 "$OMNID_PID" 2>/dev/null || break
  sleep 1
done
if [ $healthy = 1 ]; then
  say "omnid healthy at $URL"
  bench=(python3 bench/realtime.py --url "$URL" --commit "${COMMIT:-manual,vad}" --sessions "${SESSIONS:-1,8,32}"
         --cold "${COLD:-1}" --turns "${TURNS:-10}" --level-turns "${LEVEL_TURNS:-32=6}" --level-deadline-s "${LEVEL_S:-30}"
         --max-tokens 24 --audio-tokens 48 --label omni-realtime-issue26
         --server-note "omnid serve ${device[*]} (the README's GPU command), Qwen3-Omni-30B-A3B random weights${SCALED:+ (scaled)}"
         --out "$R/realtime26.json" --md "$R/realtime26.md" ${BENCH_ARGS:-})
  say "${bench[*]}"
  timeout -k 10 $(( $(left) - 45 )) "${bench[@]}" > "$R/bench.log" 2>&1
  say "bench rc=$?"
  grep -E "level|turns ok|warm-up" "$R/bench.log" | tail -30 | tee -a "$LOG"
  python3 -c "import urllib.request as u; print(u.urlopen('$URL/metrics', timeout=10).read().decode())" \
    > "$R/metrics.txt" 2>&1
else
  say "omnid not healthy within ${START_S:-240} s"; tail -20 "$R/omnid.log" | tee -a "$LOG"
fi
stop_omnid; trap - EXIT
for f in realtime26.md realtime26.json metrics.txt; do [ -f "$R/$f" ] && cp "$R/$f" "$OUT/$f"; done
[ -f "$R/realtime26.md" ] && grep -E "^\| (cold|warm)|^- " "$R/realtime26.md" | tee -a "$LOG"
tail -n 40 "$R/omnid.log" > "$OUT/omnid_tail.log" 2>/dev/null
say "done in $(( $(date +%s) - T0 ))s"
cp "$LOG" "$OUT/realtime26.log"
find "$R" -type f -size +4M -name '*.log' | while read -r f; do tail -c 4M "$f" > "$f.tail" && mv "$f.tail" "$f"; done
tar czf "$OUT/r26.tgz" --exclude=q3o -C "$(dirname "$R")" "$(basename "$R")"
ls -la "$OUT"
