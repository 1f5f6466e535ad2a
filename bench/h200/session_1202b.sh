#!/usr/bin/env bash
# One device call, 2026-12-02 (second): the GPU tests (only the files with `gpu` tests: the image has
# no openai/schemathesis for the others), then issue18.sh on the one H200 (tp_check with two ranks on
# one GPU, suite (a) at c=1,16,32,64: the serving regression after #15). carry: .whl
set -uo pipefail
T0=$(date +%s)
bash bench/h200/gpu_tests.sh
TOTAL_S=${TOTAL_S:-$(( 560 - ($(date +%s) - T0) ))} bash bench/h200/issue18.sh 2>&1 | tail -40
echo "session done in $(( $(date +%s) - T0 )) s"
