#!/usr/bin/env bash
# FP8 weights (issue 28) on one H200: the gpu-marked FP8 tests (each FP8 kernel vs the dequantized bf16
# matmul at M = 1, 16, 64, 512 on the real shapes, inside a CUDA graph, an FP8 thinker on the engine), then
# bench/fp8_thinker.py on the full-size random thinker: weights GB bf16 vs fp8 (and KV blocks freed), decode
# ms per token at batch 1 and 64 in bf16 vs fp8 (CUDA graphs + Triton paged decode), and the teacher-forced
# top-1 agreement of the FP8 thinker with its dequantized bf16 twin over 2,048 positions. carry: .whl
# Everything lands in $OUT as it goes: gpu_tests.log, fp8_thinker.json (rewritten after every part),
# fp8_thinker.log, fp8.log. Environment: PARTS (tests,bench), TESTS_S (200), BENCH_S (360),
#   BENCH_ARGS ("--batch 1,64 --tokens 32 --positions 2048"), GPU_TEST_FILES (tests/test_fp8_kernels.py
#   tests/test_moe_triton.py).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d /tmp/fp8-out.XXXX)}
PARTS=",${PARTS:-tests,bench},"
has() { [[ "$PARTS" == *,$1,* ]]; }
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/fp8.log"; }
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl || exit 2
export PYTHONPATH=/tmp/whl:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/fp8.log"
if has tests; then
  log "gpu tests"
  # shellcheck disable=SC2086
  timeout ${TESTS_S:-200} python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA \
    ${GPU_TEST_FILES:-tests/test_fp8_kernels.py tests/test_moe_triton.py} > "$OUT/gpu_tests.log" 2>&1
  log "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -40 | tee -a "$OUT/fp8.log"
fi
if has bench; then
  log "fp8 thinker bench"
  # shellcheck disable=SC2086
  timeout ${BENCH_S:-360} python3 bench/fp8_thinker.py ${BENCH_ARGS:---batch 1,64 --tokens 32 --positions 2048} \
    --out "$OUT/fp8_thinker.json" > "$OUT/fp8_thinker.log" 2>&1
  log "bench rc=$?"; tail -15 "$OUT/fp8_thinker.log" | tee -a "$OUT/fp8.log"
fi
