#!/usr/bin/env bash
# One device call, 2026-12-02 (second): the GPU tests (only the files with `gpu` tests: the image has
# no openai/schemathesis for the others), then issue18.sh on the one H200 (tp_check with two ranks on
# one GPU, suite (a) at c=1,16,32,64: the serving regression after #15). carry: .whl
set -uo pipefail
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl .whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
PYTHONPATH=/tmp/whl:$PWD timeout ${GPU_TESTS_S:-200} python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA \
  --continue-on-collection-errors $(grep -l "mark.gpu" tests/*.py) > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -20
TOTAL_S=${TOTAL_S:-$(( 560 - ($(date +%s) - T0) ))} bash bench/h200/issue18.sh 2>&1 | tail -40
echo "session done in $(( $(date +%s) - T0 )) s"
