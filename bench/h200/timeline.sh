#!/usr/bin/env bash
# Issue 23 (1): where every millisecond goes, on one H200 (bench/timeline.py). Full-size random bf16 weights,
# omnid as the README's GPU command starts it (--device cuda --dtype bfloat16, nothing else), per-stage
# timelines at c = 1, 16, 64 for both families, with nvidia-smi's utilisation beside them:
#   omni          Qwen3-Omni-30B-A3B (presets_full), default slots, c = 1,16,64, 32 thinker tokens + 64 frames
#   omni-slots64  the same with max_num_seqs=64 for thinker and talker, c = 64 (more slots, less throughput?)
#   tts           Qwen3-TTS 12Hz-1.7B CustomVoice (make-tiny --preset full-1.7b), voice vivian, c = 1,16,64, 64 frames
#   tts-slots64   the same with talker max_num_seqs=64, c = 64
#   omni-nolookahead, tts-nolookahead  as omni / tts with lookahead decode off (omni/stages/ar/lookahead.py): its A/B
#   q25           Qwen2.5-Omni-7B (make-tiny qwen2.5-omni --preset full-7b: random weights drawn at load), as omni but
#                 256 talker tokens: its talker speaks 50 tokens an audio second, so 5.1 s of audio as omni's 64 frames
#   omni-rowsoff  as omni with the talker's deferred text rows off (batch_text_rows=false): their A/B
#   tts-interval4  as tts with the talker's prefill_interval=4 (arrivals gathered into fewer prefill steps; at c=64
#                  one talker step in three was a one-row prefill, 24 rows a step on average)
# carry: .whl (omni's wheels). ~5-6 min. -> $OUT/timeline-*.md, $OUT/timeline-*.json, $OUT/timeline.log,
# $OUT/omnid_tails.log. Environment: VARIANTS (default "omni omni-slots64 tts tts-slots64"), TOTAL_S (540:
# a variant that would start past it is skipped), LEVEL_S (40: no new request past it in a level),
# TIMELINE_ARGS (more bench/timeline.py arguments for every variant), PROFILE=1 (torch.profiler windows of the
# talker's and the codec/code2wav's steps under the load, omni/stages/step_profiler.py: OMNI_PROFILE_SKIP, default
# "150,2500,5000", OMNI_PROFILE_STEPS 30; kernel tables in $OUT/prof.tgz, the chrome traces in
# $OUT/prof-traces.tgz when under 15 MB), SCALED=1 (a CPU dry run of this script:
# tiny checkpoints, c = 1,2, short requests).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=${R:-/tmp/rtl}
mkdir -p "$R" "$OUT"
t0=$(date +%s)
if [ -z "${SCALED:-}" ] && [ ! -d /tmp/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl \
    > "$R/pip.log" 2>&1 || { echo "wheel install failed"; tail -5 "$R/pip.log"; }
fi
export PYTHONPATH=/tmp/whl:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$R/gpu.txt"
if [ -n "${SCALED:-}" ]; then
  device=(--device cpu) omni_make=(make-tiny qwen3-omni --preset tiny-a) tts_preset=tiny-a tts_device=cpu q25_preset=tiny-a
  levels=1,2 high=2 tokens=(--max-tokens 4 --audio-tokens 8) frames=(--frames 8) q25_tokens=8
else
  device=(--device cuda --dtype bfloat16) omni_make=() tts_preset=full-1.7b tts_device=cuda q25_preset=full-7b
  levels=1,16,64 high=64 tokens=(--max-tokens 32 --audio-tokens 64) frames=(--frames 64) q25_tokens=256
fi
if [ -n "${PROFILE:-}" ]; then
  export OMNI_PROFILE_DIR="$R/prof" OMNI_PROFILE_STAGES=${OMNI_PROFILE_STAGES:-talker,codec,code2wav}
  export OMNI_PROFILE_SKIP=${OMNI_PROFILE_SKIP:-150,2500,5000} OMNI_PROFILE_STEPS=${OMNI_PROFILE_STEPS:-30}
fi
log() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$R/timeline.log"; }

model_dir() {  # family -> a model dir with full-size random weights (drawn at start for Qwen3-Omni)
  case $1 in
    omni) if [ ! -d "$R/omni-model" ]; then
            if [ -n "${SCALED:-}" ]; then python3 -m omni.api.cli "${omni_make[@]}" "$R/omni-model"
            else python3 -c "from omni.models.qwen3_omni.checkpoint.presets_full import write_random_model_dir as w
w('$R/omni-model')"; fi >> "$R/timeline.log" 2>&1
          fi; echo "$R/omni-model" ;;
    q25) [ -d "$R/q25-model" ] || python3 -m omni.api.cli make-tiny qwen2.5-omni "$R/q25-model" --preset $q25_preset \
           >> "$R/timeline.log" 2>&1; echo "$R/q25-model" ;;
    tts) [ -d "$R/tts-model" ] || python3 -m omni.api.cli make-tiny qwen3-tts "$R/tts-model" --kind custom-voice \
           --preset $tts_preset --device $tts_device >> "$R/timeline.log" 2>&1; echo "$R/tts-model" ;;
  esac
}

for variant in ${VARIANTS:-omni omni-slots64 tts tts-slots64}; do
  left=$(( ${TOTAL_S:-540} - ($(date +%s) - t0) ))
  if [ $left -lt 90 ]; then log "$variant skipped: ${left} s left"; continue; fi
  family=${variant%%-*}; bench_family=$family; [ "$family" = q25 ] && bench_family=omni
  case $variant in
    omni) extra=(--concurrency $levels "${tokens[@]}") ;;
    omni-slots64) extra=(--concurrency $high "${tokens[@]}" --set thinker.args.max_num_seqs=64
                         --set talker.args.max_num_seqs=64) ;;
    tts) extra=(--concurrency $levels "${frames[@]}") ;;
    tts-slots64) extra=(--concurrency $high "${frames[@]}" --set talker.args.max_num_seqs=64) ;;
    omni-nolookahead) extra=(--concurrency $levels "${tokens[@]}" --set thinker.args.lookahead_decode=false
                             --set talker.args.lookahead_decode=false) ;;
    tts-nolookahead) extra=(--concurrency $levels "${frames[@]}" --set talker.args.lookahead_decode=false) ;;
    q25) extra=(--concurrency $levels "${tokens[@]}" --audio-tokens $q25_tokens) ;;  # Qwen2.5-Omni-7B (issue 29)
    omni-rowsoff) extra=(--concurrency $levels "${tokens[@]}" --set talker.args.batch_text_rows=false) ;;
    tts-interval4) extra=(--concurrency $levels "${frames[@]}" --set talker.args.prefill_interval=4) ;;
    *) log "unknown variant $variant"; continue ;;
  esac
  dir=$(model_dir "$family")
  log "$variant: $dir (${left} s left)"
  timeout -k 10 $(( left - 10 )) python3 bench/timeline.py --family "$bench_family" --model "$dir" "${device[@]}" \
    --label "$variant" --out-dir "$R" --level-s ${LEVEL_S:-40} --start-s 240 "${extra[@]}" \
    ${TIMELINE_ARGS:-} > "$R/timeline-$variant.log" 2>&1
  log "$variant: rc=$?"
  grep -E "healthy|^  ok|c=[0-9]+:" "$R/timeline-$variant.log" | tee -a "$R/timeline.log"
done
cp "$R"/timeline*.md "$R"/timeline*.json "$R/timeline.log" "$OUT/" 2>/dev/null
tail -n 15 "$R"/omnid-*.log > "$OUT/omnid_tails.log" 2>/dev/null
if [ -d "$R/prof" ]; then  # the kernel tables always come back; the traces only when small enough (16 MiB a file)
  tar czf "$OUT/prof.tgz" -C "$R" --exclude '*.json.gz' prof
  tar czf "/tmp/prof-traces.tgz" -C "$R" --exclude '*.txt' prof && [ "$(stat -c %s /tmp/prof-traces.tgz)" -lt 15000000 ] \
    && cp /tmp/prof-traces.tgz "$OUT/"
fi
log "done"
