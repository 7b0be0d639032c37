#!/usr/bin/env bash
# The CUDA check for a machine with a GPU, in one call (under 8 minutes on one H200): builds the
# CUDA backend for sm_90, runs the host bookkeeping tests, the CUDA parity tests (CUDA vs CPU
# backend vs tests/vectors) and the decode benchmark, then prints a summary. Logs go to $OUT
# (when set) or build-gpu/logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=build-gpu
logs=${OUT:-$build/logs}
mkdir -p "$logs"
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$logs/gpu.txt" || true

configure() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFPA_CUDA_ARCHS=90 >"$logs/configure.log" 2>&1
}
if ! configure; then
  echo "configure failed; installing packages (scripts/deps.sh) and retrying"
  scripts/deps.sh >>"$logs/configure.log" 2>&1
  configure || { tail -30 "$logs/configure.log"; exit 1; }
fi
if ! grep -q "CUDA backend ON" "$logs/configure.log"; then
  echo "CMake did not enable CUDA (no nvcc?):"; grep "CUDA" "$logs/configure.log"; exit 1
fi
echo "configured in $(elapsed)s"
if ! cmake --build "$build" -j"$(nproc)" --target cuda_plan_test cuda_parity_test cuda_decode_bench \
    >"$logs/build.log" 2>&1; then
  grep -E "error|Error" -A3 "$logs/build.log" | head -60; exit 1
fi
echo "built in $(elapsed)s"

status=0
summary=()
run_test() {  # name, timeout, binary
  local line rc=0
  timeout "$2" "$3" --gtest_color=no >"$logs/$1.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    line="$1: PASS ($(grep -E '^\[  PASSED  \]' "$logs/$1.log"), $(grep -cE '^\[  SKIPPED \] [A-Za-z]' "$logs/$1.log") skipped)"
  else
    status=1
    line="$1: FAIL (rc $rc, see $logs/$1.log)"
    grep -E "Failure|Expected|Which is|actual|step |FAILED" "$logs/$1.log" | head -40
  fi
  echo "$line"
  summary+=("$line")
}
run_test cuda_plan_test 60 "$build/tests/gpu/cuda_plan_test"
run_test cuda_parity_test 150 "$build/tests/gpu/cuda_parity_test"
if grep -q "no CUDA device" "$logs/cuda_parity_test.log"; then
  summary+=("WARNING: no CUDA device here: the parity tests skipped and nothing was measured")
fi
echo "tests done at $(elapsed)s"

rc=0
timeout 240 "$build/tests/gpu/cuda_decode_bench" --steps 8 >"$logs/bench.txt" 2>&1 || rc=$?
if ((rc == 0)); then
  summary+=("cuda_decode_bench: done")
else
  status=1
  summary+=("cuda_decode_bench: FAILED or timed out (rc $rc)")
fi

echo
echo "===== summary ($(elapsed)s) ====="
printf '%s\n' "${summary[@]}"
echo
cat "$logs/bench.txt"
exit $status
