#!/usr/bin/env bash
# Issue 12, call 4: where the speech step's time goes after the sampler moved into the graphs:
# the code predictor's sampled graph and code2wav per frame at B = 1, 16, 64 (talker_step_gpu.py),
# and a profile of the thinker's decode step (profile_decode.py). carry: .whl  -> $OUT/i12c.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1 R=/tmp/i12c
mkdir -p $R
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl
export PYTHONPATH=/tmp/whl:$PWD
timeout 150 python3 bench/talker_step_gpu.py --batch 1,16,64 --frames 30 --chunks 6 --out $R/talker_step.json \
  > $R/talker_step.log 2>&1; tail -8 $R/talker_step.log
timeout 150 python3 bench/profile_decode.py --out-dir $R/profile --batch 1,16 --backends triton --mode graphs+triton \
  --deadline-s 120 > $R/profile.log 2>&1; tail -30 $R/profile.log
tar czf $OUT/i12c.tgz -C /tmp i12c
