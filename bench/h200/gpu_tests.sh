#!/usr/bin/env bash
# The `-m gpu` tests on the H200 image: omni's wheels into /tmp/whl (carry: .whl), then only the test
# files that have gpu tests (the image has no openai/schemathesis for the others). -> $OUT/gpu_tests.log
set -uo pipefail
t0=$(date +%s)
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl \
  .whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
PYTHONPATH=/tmp/whl:$PWD timeout ${GPU_TESTS_S:-200} python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA \
  --continue-on-collection-errors $(grep -l "mark.gpu" tests/*.py) > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -${GPU_TESTS_LINES:-20}
