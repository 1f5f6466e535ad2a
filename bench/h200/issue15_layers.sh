#!/usr/bin/env bash
# Issue 15 part 2 (omni/layers): the GPU tests of the code the move touched, on one H200. The shared
# RMSNorm now runs the fused Triton kernel in code2wav's pre-transformer too (it was plain torch there),
# the MoE kernels share jit helpers (moe_triton._block_rows / _dot), the thinker's Attention and the
# talker's attention are one QKVProjection, and the talker's MoE is SparseMoE's routing.
# carry: .whl   -> $OUT/gpu_layers.log
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl || exit 2
PYTHONPATH=/tmp/whl:$PWD timeout 500 python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA \
  tests/test_fused_ops.py tests/test_moe_triton.py tests/test_cuda_graphs.py tests/test_code_predictor_graphs.py \
  tests/test_vocoder_gpu.py tests/test_qwen3_talker.py tests/test_talker_device_paths.py > $OUT/gpu_layers.log 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu_layers.log | tail -40
