#!/usr/bin/env bash
# The kernel benches on one H200 (issue 7 onwards): GPU tests, the MoE kernels, the talker step (code
# predictor + code2wav per frame), the talker's CUDA parity, a profile of the thinker's decode step, and
# (part `decode`) thinker decode with the fused norm/rope/router ops on and off. SGLang kit part a
# installs in the background when carried (.sglkit/a, .sglkit/install.sh). carry: .whl
# Everything lands in $R (/tmp/r1) and comes back as $OUT/r1.tgz (a call returns at most 8 files).
# Environment: PARTS (tests,moe,talker,parity,profile; add `decode` for fused vs unfused decode, `codec` for
#   both codec decoders eager vs CUDA graphs, bench/codec_graphs_gpu.py with CODEC_ARGS, CODEC_S (150)),
#   GPU_TEST_FILES (the tests part's files), TALKER_ARGS ("--batch 1,16"), TALKER_S (60),
#   PROFILE_ARGS ("--batch 1,16 --steps 10 --deadline-s 105"), PROFILE_S (120),
#   DECODE_ARGS ("--batch 1,16 --tokens 32 --modes graphs+triton"), R, TGZ (r1.tgz).
# Old calls: final.sh = PARTS=tests,decode GPU_TEST_FILES="tests/test_fused_ops.py tests/test_engine_host_path.py
#   tests/test_talker_device_paths.py tests/test_cuda_graphs.py" (+ serve.sh's suite at c=1,16: see README);
#   issue12_c.sh = PARTS=talker,profile TALKER_ARGS="--batch 1,16,64 --frames 30 --chunks 6" TALKER_S=150
#   PROFILE_ARGS="--batch 1,16 --backends triton --mode graphs+triton --deadline-s 120" PROFILE_S=150.
set -uo pipefail
export PYTHONUNBUFFERED=1 R=${R:-/tmp/r1}
OUT=${OUT:-$(mktemp -d /tmp/kernels-out.XXXX)}
PARTS=",${PARTS:-tests,moe,talker,parity,profile},"
has() { [[ "$PARTS" == *,$1,* ]]; }
mkdir -p $R
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl || exit 2
export PYTHONPATH=/tmp/whl:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
[ -d .sglkit/a ] && (bash .sglkit/install.sh .sglkit/a > $R/sglkit_a.log 2>&1; echo "sglkit a rc=$?" >> $R/sglkit_a.log) &
if has tests; then
  # shellcheck disable=SC2086
  timeout 200 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA ${GPU_TEST_FILES:-tests/test_moe_triton.py \
    tests/test_code_predictor_graphs.py tests/test_vocoder_gpu.py tests/test_cuda_graphs.py tests/test_kernel_gpu.py} \
    > $R/gpu_tests.log 2>&1; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -40
fi
has moe && { timeout 100 python3 bench/moe_kernels.py --out $R/moe_kernels.json > $R/moe_kernels.log 2>&1; tail -25 $R/moe_kernels.log; }
# shellcheck disable=SC2086
has talker && { timeout ${TALKER_S:-60} python3 bench/talker_step_gpu.py ${TALKER_ARGS:---batch 1,16} --out $R/talker_step_gpu.json \
  > $R/talker_step.log 2>&1; tail -15 $R/talker_step.log; }
# shellcheck disable=SC2086
has codec && { timeout ${CODEC_S:-150} python3 bench/codec_graphs_gpu.py ${CODEC_ARGS:-} --out $R/codec_graphs.json \
  > $R/codec_graphs.log 2>&1; tail -40 $R/codec_graphs.log; }
has parity && { timeout 40 python3 bench/talker_parity_gpu.py --device cuda --out $R/talker_parity.json > $R/parity.log 2>&1; tail -12 $R/parity.log; }
# shellcheck disable=SC2086
has profile && { timeout ${PROFILE_S:-120} python3 bench/profile_decode.py --out-dir $R/profile \
  ${PROFILE_ARGS:---batch 1,16 --steps 10 --deadline-s 105} > $R/profile.log 2>&1; tail -30 $R/profile.log; }
if has decode; then
  # shellcheck disable=SC2086
  timeout 50 python3 bench/gpu_decode.py ${DECODE_ARGS:---batch 1,16 --tokens 32 --modes graphs+triton} \
    --out $R/decode_fused.json > $R/decode_fused.log 2>&1; tail -4 $R/decode_fused.log
  # shellcheck disable=SC2086
  timeout 50 python3 bench/gpu_decode.py --no-fused-ops ${DECODE_ARGS:---batch 1,16 --tokens 32 --modes graphs+triton} \
    --out $R/decode_unfused.json > $R/decode_unfused.log 2>&1; tail -4 $R/decode_unfused.log
fi
wait
[ -f $R/sglkit_a.log ] && cat $R/sglkit_a.log
tar czf "$OUT/${TGZ:-r1.tgz}" -C "$(dirname $R)" "$(basename $R)"
