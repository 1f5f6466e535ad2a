#!/usr/bin/env bash
# FP8 weights (issue 28) on one H200: the gpu-marked FP8 tests (each FP8 kernel vs the dequantized bf16
# matmul at M = 1, 16, 64, 512 on the real shapes, inside a CUDA graph, an FP8 thinker on the engine), then
# bench/fp8_thinker.py on the full-size random thinker: weights GB bf16 vs fp8 (and KV blocks freed), decode
# ms per token at batch 1 and 64 in bf16 vs fp8 (CUDA graphs + Triton paged decode), and the teacher-forced
# top-1 agreement of the FP8 thinker with its dequantized bf16 twin over 2,048 positions; between them
# bench/fp8_kernels.py (each FP8 kernel vs its bf16 counterpart, us per call, thinker shapes). carry: .whl
# Everything lands in $OUT as it goes: gpu_tests.log, fp8_kernels.json, fp8_thinker.json (rewritten after
# every part), the logs, fp8.log. Whole script <= 9.5 min. Environment: PARTS (tests,kernels,bench),
#   TESTS_S (170), KERNELS_S (75), BENCH_S (310), KERNELS_ARGS ("--rows 1,16,64,512"; add --sweep for the
#   dense config grid, ~2 min more), BENCH_ARGS ("--batch 1,64 --tokens 32 --positions 2048"),
#   GPU_TEST_FILES (tests/test_fp8_kernels.py tests/test_fp8.py: its gpu test skips where transformers is missing).
# Part `suite` (not in the default PARTS; a call of its own, ~6 min): the speech serving suite at
#   c = 1,16,64 with omnid --quantization fp8 (SUITE_QUANT=bf16: the same without it, for the RTF comparison),
#   into $OUT/suite-<label>.md/.json; SUITE_S (380), SUITE_ARGS (extra gpu_suite.py arguments).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d /tmp/fp8-out.XXXX)}; mkdir -p "$OUT"
PARTS=",${PARTS:-tests,kernels,bench},"
has() { [[ "$PARTS" == *,$1,* ]]; }
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/fp8.log"; }
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl || exit 2
export PYTHONPATH=/tmp/whl:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/fp8.log"
if has tests; then
  log "gpu tests"
  # shellcheck disable=SC2086
  timeout ${TESTS_S:-170} python3 -m pytest -v -o addopts="" -m gpu -p no:cacheprovider -rfE \
    ${GPU_TEST_FILES:-tests/test_fp8_kernels.py tests/test_fp8.py} > "$OUT/gpu_tests.log" 2>&1
  log "gpu tests rc=$?"; grep -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/gpu_tests.log" | tail -60 | tee -a "$OUT/fp8.log"
fi
if has kernels; then
  log "fp8 kernels vs bf16"
  # shellcheck disable=SC2086
  timeout ${KERNELS_S:-75} python3 bench/fp8_kernels.py ${KERNELS_ARGS:---rows 1,16,64,512} --out "$OUT/fp8_kernels.json" \
    > "$OUT/fp8_kernels.log" 2>&1
  log "kernels rc=$?"; tail -20 "$OUT/fp8_kernels.log" | tee -a "$OUT/fp8.log"
fi
if has bench; then
  log "fp8 thinker bench"
  # shellcheck disable=SC2086
  timeout ${BENCH_S:-310} python3 bench/fp8_thinker.py ${BENCH_ARGS:---batch 1,64 --tokens 32 --positions 2048} \
    --out "$OUT/fp8_thinker.json" > "$OUT/fp8_thinker.log" 2>&1
  log "bench rc=$?"; tail -15 "$OUT/fp8_thinker.log" | tee -a "$OUT/fp8.log"
fi
if has suite; then
  label=omni-${SUITE_QUANT:-fp8}
  quant=(); [ "${SUITE_QUANT:-fp8}" = fp8 ] && quant=(--omnid-arg=--quantization --omnid-arg=fp8)
  log "speech suite $label"
  # shellcheck disable=SC2086
  timeout ${SUITE_S:-380} python3 bench/gpu_suite.py --out-dir /tmp/suite-$label --label $label --no-hf \
    --concurrency 1,16,64 --cold= --greedy-levels= --budget-s $(( ${SUITE_S:-380} - 20 )) "${quant[@]}" ${SUITE_ARGS:-} \
    > "$OUT/suite-$label.log" 2>&1
  log "suite rc=$?"
  cp /tmp/suite-$label/suite.md "$OUT/suite-$label.md" 2>/dev/null; cp /tmp/suite-$label/suite.json "$OUT/suite-$label.json" 2>/dev/null
  tail -20 "$OUT/suite-$label.md" 2>/dev/null | tee -a "$OUT/fp8.log"
fi
