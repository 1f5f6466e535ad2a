#!/usr/bin/env bash
# Call 1: SGLang kit part a (in the background), then issue 7's GPU tests and kernel benches.
# Everything lands in /tmp/r1 and comes back as $OUT/r1.tgz (a call returns at most 8 files).
set -uo pipefail
export PYTHONUNBUFFERED=1 R=/tmp/r1
mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl || exit 2
export PYTHONPATH=/tmp/whl:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
(bash .sglkit/install.sh .sglkit/a > $R/sglkit_a.log 2>&1; echo "sglkit a rc=$?" >> $R/sglkit_a.log) &
timeout 200 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA tests/test_moe_triton.py \
  tests/test_code_predictor_graphs.py tests/test_vocoder_gpu.py tests/test_cuda_graphs.py tests/test_kernel_gpu.py \
  > $R/gpu_tests.log 2>&1; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -40
timeout 100 python3 bench/moe_kernels.py --out $R/moe_kernels.json > $R/moe_kernels.log 2>&1; tail -25 $R/moe_kernels.log
timeout 60 python3 bench/talker_step_gpu.py --batch 1,16 --out $R/talker_step_gpu.json > $R/talker_step.log 2>&1; tail -15 $R/talker_step.log
timeout 40 python3 bench/talker_parity_gpu.py --device cuda --out $R/talker_parity.json > $R/parity.log 2>&1; tail -12 $R/parity.log
timeout 120 python3 bench/profile_decode.py --out-dir $R/profile --batch 1,16 --steps 10 --deadline-s 105 > $R/profile.log 2>&1; tail -30 $R/profile.log
wait
cat $R/sglkit_a.log
tar czf $OUT/r1.tgz -C /tmp r1
