#!/usr/bin/env bash
# The `-m gpu` tests on the H200 image: omni's wheels into /tmp/whl (carry: .whl), then the test files
# that have gpu tests (the image has no openai/schemathesis for the others). -> $OUT/gpu_tests.log
# Environment: GPU_TEST_FILES="tests/test_a.py tests/test_b.py" (a subset; default every file with a
#   `mark.gpu`), GPU_TESTS_S (200: the time limit), GPU_TESTS_LINES (20: summary lines printed),
#   GPU_TESTS_LOG (gpu_tests.log: the log's name under $OUT).
set -uo pipefail
t0=$(date +%s)
OUT=${OUT:-$(mktemp -d /tmp/gpu-tests-out.XXXX)}
[ -d /tmp/whl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/whl \
  .whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
# shellcheck disable=SC2046
PYTHONPATH=/tmp/whl:$PWD timeout ${GPU_TESTS_S:-200} python3 -m pytest -q -o addopts="" -m gpu -p no:cacheprovider -rA \
  --continue-on-collection-errors ${GPU_TEST_FILES:-$(grep -l "mark.gpu" tests/*.py)} \
  > "$OUT/${GPU_TESTS_LOG:-gpu_tests.log}" 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/${GPU_TESTS_LOG:-gpu_tests.log}" | tail -${GPU_TESTS_LINES:-20}
