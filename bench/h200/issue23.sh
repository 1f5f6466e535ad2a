#!/usr/bin/env bash
# Issue 23 on one H200: the fused code predictor frame against the unfused graph (bench/predictor_fused_gpu.py),
# then the GPU tests of the code predictor. Outputs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.used --format=csv
python3 bench/predictor_fused_gpu.py --batch 1,16,64 --frames 50 --out "$OUT/predictor_fused.json" 2>&1 | tee "$OUT/predictor_fused.log"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_code_predictor_graphs.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
