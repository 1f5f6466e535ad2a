#!/usr/bin/env bash
# Issue 18 (several GPUs), one device call (10 minutes): checks the GPU count and runs what it allows.
#
#   1 GPU : the tensor-parallel correctness check with two ranks on the one GPU (gloo: NCCL refuses two
#           ranks on one GPU; bench/tp_check.py: TP=1 vs TP=2 greedy tokens on tiny checkpoints through
#           the GPU kernels), then (a) the speech suite with everything on the GPU at c=1,16,32,64.
#   2+ GPUs: the GPU tests that need two GPUs (cuda_ipc from one GPU to another), tp_check.py with
#           NCCL over cuda:0,cuda:1, then the speech suite at c=1,16,32,64 for
#           (a) everything on GPU 0,
#           (b) `--gpus 0..N-1`: the thinker alone on GPU 0, N-1 talker and N-1 code2wav replicas
#               spread over the others,
#           (c) a TP=2 thinker on GPUs 0,1 (CUDA graphs off in the thinker: not captured with
#               collectives; MPS off: NCCL under MPS is not tried), talker and code2wav replicas on the
#               rest (or beside its ranks with 2 GPUs).
# Each suite row gives RTF, TTFA and audio seconds per second; summary.md adds audio s/s per GPU used.
# -> $OUT/issue18.log, $OUT/summary.md, $OUT/tp_check*.json, $OUT/suite-<variant>.md, $OUT/issue18.tgz
#
# carry: .whl (msgspec, pyzmq wheels, as the other scripts)
# Environment (optional): VARIANTS="a b c" (which suites), LEVELS=1,16,32,64, SUITE_S (per suite; default
#   an even share of what is left),
#   CHECK=0 (skip the correctness checks, e.g. in a second call), TOTAL_S=570, SUITE_ARGS="..." (more bench/gpu_suite.py arguments), DRY_RUN=1 (print the commands;
#   with NGPU=4 to see a 4-GPU run's commands anywhere)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} \
  NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
T0=$(date +%s)
OUT=${OUT:-$(mktemp -d /tmp/issue18-out.XXXX)}
R=${R:-/tmp/r18}
mkdir -p "$R" "$OUT"
LOG="$R/issue18.log"
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( ${TOTAL_S:-570} - ($(date +%s) - T0) )); }
run() { if [ "${DRY_RUN:-0}" = 1 ]; then echo "DRY: $*"; else "$@"; fi; }
LEVELS=${LEVELS:-1,16,32,64}

if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl \
    >> "$LOG" 2>&1 || say "wheel install failed (see log)"
fi
export PYTHONPATH=/tmp/whl:$PWD${PYTHONPATH:+:$PYTHONPATH}
NGPU=${NGPU:-$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG" || echo 0)}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$LOG"
command -v nvidia-smi >/dev/null && [ "$NGPU" -ge 2 ] && nvidia-smi topo -m >> "$LOG" 2>&1
say "issue18.sh: $NGPU GPU(s), levels $LEVELS, OUT=$OUT; multicast: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
if [ "$NGPU" -lt 1 ]; then say "no GPU: nothing to run"; exit 2; fi
DEFAULT_VARIANTS="a"; [ "$NGPU" -ge 2 ] && DEFAULT_VARIANTS="a b c"
VARIANTS=${VARIANTS:-$DEFAULT_VARIANTS}
[ "$NGPU" -lt 2 ] && say "skipped (need 2+ GPUs): suites (b) thinker apart and (c) TP=2 thinker; the 2-GPU tests; tp_check with NCCL"

# --- correctness first: TP=2 vs TP=1 greedy tokens (and the 2-GPU cuda_ipc test) ------------------
TP_DEVICES=cuda:0,cuda:0; [ "$NGPU" -ge 2 ] && TP_DEVICES=cuda:0,cuda:1
if [ "${CHECK:-1}" != 1 ]; then
  say "CHECK=0: the correctness checks are skipped"
else
  if [ "$NGPU" -ge 2 ]; then
    run timeout 150 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA -s \
      "tests/test_transport_cuda_ipc.py::test_a_consumer_on_the_second_gpu_reads_the_first_gpus_pool" \
      "tests/test_tensor_parallel.py::test_tp2_on_two_gpus_over_nccl_gives_the_greedy_tokens_of_tp1" \
      > "$R/gpu2_tests.log" 2>&1
    say "2-GPU tests: $(grep -E 'passed|failed|error' "$R/gpu2_tests.log" | tail -1)"
    grep -E "peer access" "$R/gpu2_tests.log" | tee -a "$LOG"
  fi
  run timeout 150 python3 bench/tp_check.py --devices "$TP_DEVICES" --out "$OUT/tp_check.json" >> "$LOG" 2>&1
  rc=$?
  say "tp_check ($TP_DEVICES): rc=$rc $(python3 -c "import json; r=json.load(open('$OUT/tp_check.json'))['results']; print('; '.join(f\"{x['checkpoint']} {x['dtype']}: {x.get('identical_requests')}/{x.get('requests')} identical {x.get('error','')}\" for x in r))" 2>/dev/null)"
fi

# --- the speech suites ---------------------------------------------------------------------------
all_gpus() { seq -s, 0 $(( NGPU - 1 )); }
remaining=$(echo $VARIANTS | wc -w)
for v in $VARIANTS; do
  room=$(( ($(left) - 30) / remaining )); remaining=$(( remaining - 1 ))
  budget=${SUITE_S:-$room}; [ "$budget" -gt "$room" ] && budget=$room
  if [ "$budget" -lt 90 ]; then say "suite ($v): skipped, only ${budget}s left"; continue; fi
  extra=(); gpus_used=1
  case $v in
    a) label=one-gpu; extra=(--omnid-arg=--gpus=0) ;;
    b) label=thinker-apart; r=$(( NGPU - 1 )); gpus_used=$NGPU
       extra=(--omnid-arg=--gpus=$(all_gpus) --set talker.replicas=$r --set code2wav.replicas=$r) ;;
    c) label=tp2-thinker; gpus_used=$NGPU; r=$(( NGPU > 2 ? NGPU - 2 : 1 ))
       extra=(--omnid-arg=--gpus=$(all_gpus) --omnid-arg=--mps=off --set thinker.args.tensor_parallel_size=2
              --set thinker.args.cuda_graphs=false --set talker.replicas=$r --set code2wav.replicas=$r) ;;
    *) say "unknown variant $v"; continue ;;
  esac
  if [ "$v" != a ] && [ "$NGPU" -lt 2 ]; then say "suite ($v): skipped (needs 2+ GPUs)"; continue; fi
  say "suite ($v) $label: ${budget}s, ${extra[*]}"
  run timeout $(( budget + 20 )) python3 bench/gpu_suite.py --out-dir "$R/$label" --label "$label" --no-hf \
    --concurrency "$LEVELS" --cold "" --greedy-levels "" --budget-s "$budget" "${extra[@]}" ${SUITE_ARGS:-} \
    > "$R/$label.out" 2>&1
  say "suite ($v) rc=$? $(tail -1 "$R/$label.out")"
  [ -f "$R/$label/suite.md" ] && cp "$R/$label/suite.md" "$OUT/suite-$label.md"
  echo "$label $gpus_used" >> "$R/variants.txt"
done

# --- summary: RTF, TTFA, audio s/s, audio s/s per GPU ------------------------------------------------
python3 - "$R" > "$OUT/summary.md" 2>>"$LOG" <<'EOF'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
print("| variant | GPUs | c | ok | RTF p50 | TTFA p50 ms | audio s/s | audio s/s per GPU |")
print("|---|---|---|---|---|---|---|---|")
variants = [l.split() for l in (root / "variants.txt").read_text().splitlines()] if (root / "variants.txt").exists() else []
for label, gpus in variants:
    try:
        rep = json.loads((root / label / "suite.json").read_text())
    except (OSError, ValueError):
        print(f"| {label} | {gpus} | - | no suite.json | | | | |")
        continue
    for lv in (rep.get("omni") or {}).get("levels", []):
        aps = (lv.get("throughput") or {}).get("audio_s_per_s")
        per = round(aps / int(gpus), 3) if aps else None
        print(f"| {label} | {gpus} | {lv['concurrency']} | {lv.get('ok')}/{lv.get('requests')} | "
              f"{(lv.get('rtf') or {}).get('p50')} | {(lv.get('ttfa_ms') or {}).get('p50')} | {aps} | {per} |")
EOF
cat "$OUT/summary.md" | tee -a "$LOG"
cp "$LOG" "$OUT/issue18.log"
tar -czf "$OUT/issue18.tgz" -C "$R" . 2>/dev/null
say "done"
