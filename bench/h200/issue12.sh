#!/usr/bin/env bash
# Issue 12, items 5 and 6, in one device call (10 minutes): the speech serving suite at the server's
# default sampling (a fresh server's cold levels 1,16 before any warm-up, then the warm sweep
# 1,4,16,32,64, then the greedy extra line 1,16; bench/gpu_suite.py), then the equal-work table
# against SGLang (reduced-depth full-width thinker checkpoint loaded by both engines, distinct
# prompts, c = 1,16,64, experts hit per layer; bench/equal_work.py). Each part is time-boxed and
# writes its results whatever happens. -> $OUT/issue12.tgz (everything) + $OUT/issue12.log +
# $OUT/suite-<label>.md per serve variant + $OUT/equal_work.md (at most 8 files).
#
# Environment (all optional):
#   PARTS=serve,sglang     which parts run, in this order ("serve", "sglang")
#   SERVE_BUDGET=300       seconds for all serve variants together (split evenly between them)
#   SGLANG_BUDGET=225      seconds for the equal-work table (420 when PARTS has no serve; always cut
#                          to what is left of TOTAL_S)
#   TOTAL_S=570            the whole script's wall-clock plan (the device call allows 600)
#   OMNID_ARGS="--mps=off" extra `omnid serve` arguments (each word becomes --omnid-arg=WORD)
#   OMNID_SET="talker.args.x=1 ..."  extra omnid --set overrides (each word becomes --set WORD)
#   SERVE_LABEL=omni       the variant's name in the report
#   SERVE_VARIANTS="omni-nomps:--mps=off;omni-mps:--mps=on"  several serve runs, label:omnid-args each (overrides
#                          OMNID_ARGS/SERVE_LABEL; each starts its own fresh omnid, cold levels first)
#   SUITE_ARGS="..."       more bench/gpu_suite.py arguments (e.g. --concurrency 1,16 --greedy-levels=)
#   EQUAL_ARGS="..."       more bench/equal_work.py arguments (e.g. --layers 12 --max-tokens 64)
#   HF=1                   also run the transformers baseline in the suite (default off: time)
#   SCALED=1               CPU dry run at test sizes (no GPU, no SGLang unless installed)
#   DRY_RUN=1              print the commands only
# SGLang comes from the kit of ../shared/tools/sglang-gpu-kit in two parts that cannot travel in one
# call (64 MiB): carry .sglkit/a (+ .sglkit/install.sh) in one call and .sglkit/b (+ install.sh,
# .sglkit/shim) in the next, back to back on the warm machine. This script installs whichever part is
# carried (in the background, during the serve part and omni's phases) and runs SGLang only when both
# parts are in /tmp/site; otherwise the equal-work table has omni's rows alone and the log says why.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
OUT=${OUT:-$(mktemp -d /tmp/issue12-out.XXXX)}
R=${R:-/tmp/r12}
mkdir -p "$R" "$OUT"
rm -f "$R/sglkit.done" "$R/sglkit.ok"  # a warm machine keeps /tmp: this call's install says anew
SITE=${SGLKIT_TARGET:-/tmp/site}  # where the kit installs (install.sh's default)
LOG="$R/issue12.log"
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( ${TOTAL_S:-570} - ($(date +%s) - T0) )); }
PARTS=${PARTS:-serve,sglang}
SERVE_BUDGET=${SERVE_BUDGET:-300}
if [[ ",$PARTS," == *,serve,* ]]; then SGLANG_BUDGET=${SGLANG_BUDGET:-225}; else SGLANG_BUDGET=${SGLANG_BUDGET:-420}; fi
SCALED_ARG=(); [ "${SCALED:-0}" = 1 ] && SCALED_ARG=(--scaled)
say "issue12.sh: PARTS=$PARTS SERVE_BUDGET=$SERVE_BUDGET SGLANG_BUDGET=$SGLANG_BUDGET TOTAL_S=${TOTAL_S:-570} OUT=$OUT"

# --- packages: omni's wheels (msgspec, pyzmq), the SGLang kit part that was carried -------------
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl \
    >> "$LOG" 2>&1 || say "wheel install failed (see log)"
fi
BASE_PATH=/tmp/whl:$PWD${PYTHONPATH:+:$PYTHONPATH}
KIT_PID=
if [ -f .sglkit/install.sh ] && { [ -d .sglkit/a ] || [ -d .sglkit/b ]; }; then
  ( for part in a b; do  # a before b: b's install checks that a is there (a recycled machine lost it)
      [ -d .sglkit/$part ] || continue
      req=""; [ $part = b ] && req="a b"
      SGLKIT_REQUIRE="$req" bash .sglkit/install.sh .sglkit/$part > "$R/sglkit_$part.log" 2>&1
      echo "sglkit $part rc=$?" >> "$R/sglkit_$part.log"
    done
    [ -f "$SITE/.sglkit-part-a" ] && [ -f "$SITE/.sglkit-part-b" ] && touch "$R/sglkit.ok"
    touch "$R/sglkit.done" ) &
  KIT_PID=$!
  say "SGLang kit part(s) $(ls -d .sglkit/a .sglkit/b 2>/dev/null | tr '\n' ' ')installing in the background (pid $KIT_PID)"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  | tee "$R/gpu.txt" | tee -a "$LOG"

# --- part 1: the speech serving suite (what users get: default sampling, cold then warm) ---------
if [[ ",$PARTS," == *,serve,* ]]; then
  if [ -n "${SERVE_VARIANTS:-}" ]; then VARIANTS="$SERVE_VARIANTS"; else VARIANTS="${SERVE_LABEL:-omni}:${OMNID_ARGS:-}"; fi
  IFS=';' read -ra VLIST <<< "$VARIANTS"
  n=${#VLIST[@]}
  for v in "${VLIST[@]}"; do
    label=$(echo "${v%%:*}" | tr -cd 'A-Za-z0-9._-'); args=${v#*:}
    [ -z "$label" ] && label=omni
    budget=$(( SERVE_BUDGET / n ))
    room=$(( $(left) - 40 )); [ "$budget" -gt "$room" ] && budget=$room
    if [ "$budget" -lt 60 ]; then say "serve $label: skipped (only ${budget}s left)"; continue; fi
    rm -rf "$R/suite-$label"  # no level JSON of an earlier call may count as this one's
    cmd=(python3 bench/gpu_suite.py --out-dir "$R/suite-$label" --label "$label" --budget-s "$budget" "${SCALED_ARG[@]}")
    [ "${HF:-0}" = 1 ] || cmd+=(--no-hf)
    for a in $args; do cmd+=("--omnid-arg=$a"); done
    for s in ${OMNID_SET:-}; do cmd+=(--set "$s"); done
    # shellcheck disable=SC2206
    cmd+=(${SUITE_ARGS:-})
    say "serve $label (${budget}s): ${cmd[*]}"
    [ "${DRY_RUN:-0}" = 1 ] && continue
    PYTHONPATH=$BASE_PATH timeout -k 10 $(( budget + 30 )) "${cmd[@]}" > "$R/suite-$label.log" 2>&1
    say "serve $label: rc=$?"; tail -n 40 "$R/suite-$label.log" | tee -a "$LOG" >/dev/null
    [ -f "$R/suite-$label/suite.md" ] && cp "$R/suite-$label/suite.md" "$OUT/suite-$label.md"
  done
fi

# --- part 2: equal work against SGLang ------------------------------------------------------------
if [[ ",$PARTS," == *,sglang,* ]]; then
  engines=omni
  KIT=()
  if [ -n "$KIT_PID" ] && [ -d .sglkit/b ] && [ -d .sglkit/shim ]; then
    # part b is installing: omni's phases run meanwhile, SGLang's phase waits for the install to end
    engines=omni,sglang
    KIT=(--sglang-path "$SITE:$PWD/.sglkit/shim" --sglang-wait "$R/sglkit.done" --sglang-ok "$R/sglkit.ok")
  elif [ -f "$SITE/.sglkit-part-a" ] && [ -f "$SITE/.sglkit-part-b" ] && [ -d .sglkit/shim ]; then
    engines=omni,sglang
    KIT=(--sglang-path "$SITE:$PWD/.sglkit/shim")  # SGLang's phase alone sees the kit
  elif python3 -c "import sglang" >/dev/null 2>&1; then
    engines=omni,sglang
  else
    say "SGLang is not installed here (kit parts in $SITE: $(ls "$SITE"/.sglkit-part-* 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' ')); the table has omni's rows alone. Carry .sglkit/a in one call and .sglkit/b + .sglkit/shim in the next."
  fi
  rm -rf "$R/equal_work"  # no result of an earlier call may count as this one's
  budget=$SGLANG_BUDGET
  room=$(( $(left) - 25 )); [ "$budget" -gt "$room" ] && budget=$room
  if [ "$budget" -lt 45 ]; then
    say "equal work: skipped (only ${budget}s left)"
  else
    cmd=(python3 bench/equal_work.py --out-dir "$R/equal_work" --engines "$engines" --budget-s "$budget" "${KIT[@]}" "${SCALED_ARG[@]}")
    # shellcheck disable=SC2206
    cmd+=(${EQUAL_ARGS:-})
    say "equal work (${budget}s): ${cmd[*]}"
    [ "${DRY_RUN:-0}" = 1 ] || PYTHONPATH=$BASE_PATH timeout -k 10 $(( budget + 20 )) "${cmd[@]}" > "$R/equal_work.log" 2>&1
    say "equal work: rc=$?"; tail -n 30 "$R/equal_work.log" | tee -a "$LOG" >/dev/null
    cat "$R"/sglkit_*.log >> "$LOG" 2>/dev/null
    [ -f "$R/equal_work/equal_work.md" ] && cp "$R/equal_work/equal_work.md" "$OUT/equal_work.md"
  fi
fi

if [ -n "$KIT_PID" ] && kill -0 "$KIT_PID" 2>/dev/null; then  # the call's end would kill it half-done
  say "waiting for the SGLang kit install to finish"; wait "$KIT_PID"
fi
say "done in $(( $(date +%s) - T0 ))s"
cp "$LOG" "$OUT/issue12.log"
# a file comes back only under 16 MiB: keep the last 4 MiB of any log larger than that
find "$R" -type f -size +4M -name '*.log' | while read -r f; do tail -c 4M "$f" > "$f.tail" && mv "$f.tail" "$f"; done
tar czf "$OUT/issue12.tgz" -C "$(dirname "$R")" "$(basename "$R")"
ls -la "$OUT"
