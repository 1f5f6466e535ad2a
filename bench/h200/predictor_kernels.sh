#!/usr/bin/env bash
# The code predictor's kernels on one H200: the linear kernel's launch shapes and the sampler swept
# (bench/predictor_linear_sweep.py), whole frames under other settings and fused vs unfused
# (bench/predictor_fused_gpu.py), where a frame's GPU time goes (bench/predictor_fused_profile.py),
# then the code predictor's GPU tests. Outputs under $OUT. ~7 minutes (PARTS=fused,tests: ~2).
# Environment: PARTS (sweep,settings,fused,profile,tests), SWEEP_PROJ (gate_up,down).
# Old calls: issue23.sh = PARTS=fused,tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d /tmp/predictor-out.XXXX)}
PARTS=",${PARTS:-sweep,settings,fused,profile,tests},"
has() { [[ "$PARTS" == *,$1,* ]]; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.used --format=csv
if has sweep; then
  timeout 200 python3 bench/predictor_linear_sweep.py --rows 1,64 --proj ${SWEEP_PROJ:-gate_up,down} --out "$OUT/linear_sweep.json" > "$OUT/linear_sweep.log" 2>&1
  grep -A40 "best per shape" "$OUT/linear_sweep.log"; grep sample_embed "$OUT/linear_sweep.log"
fi
has settings && timeout 120 python3 bench/predictor_fused_gpu.py --batch 1,16,64 --frames 50 \
  --tiles '{};{"warps": 1};{"warps": 2};{"plain": {"split": 4}};{"norm": {"bk": 128}}' \
  2>&1 | tee "$OUT/frame_settings.log" | grep -v Warn
has fused && timeout 120 python3 bench/predictor_fused_gpu.py --batch 1,16,64 --frames 50 --out "$OUT/predictor_fused.json" 2>&1 | tail -8 | tee "$OUT/predictor_fused.log"
if has profile; then
  for b in 1 64; do timeout 60 python3 bench/predictor_fused_profile.py --batch $b 2>&1 | tail -14 | tee "$OUT/profile_b$b.log"; done
fi
has tests && timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_code_predictor_graphs.py 2>&1 | tail -8 | tee "$OUT/gpu_tests.log"
