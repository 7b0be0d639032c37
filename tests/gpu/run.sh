#!/usr/bin/env bash
# The CUDA check for the device machine, in one call of under 8 minutes on one H200. It runs the
# bundle that tests/gpu/bundle.sh built elsewhere (carry `gpu-bundle`): no configure, no build,
# no network, nothing installed. In order:
#  1. every GPU test of the bundle (FPA_GPU_TESTS in tests/gpu/CMakeLists.txt). A test fails the
#     run when it fails, runs no test or skips any: no device, or missing vectors, is a failure.
#  2. cuda_decode_bench, whose figures end the summary.
#  3. the tests FPA_GPU_SANITIZE_FILTER selects (a gtest filter; the bundle's manifest has the
#     default, the environment can override it), again under compute-sanitizer --tool memcheck
#     and --tool racecheck, with FPA_CUDA_SYNC=1.
# FPA_CUDA_SYNC=1 makes every kernel launch and cuBLAS call in kernels/cuda/ wait for its stream
# and return the error under the kernel's name (launch_check.h), instead of letting a fault
# surface at a later call under another name; set it for any run to find a faulting kernel.
# Each step's time is capped so that the whole run ends within FPA_GPU_BUDGET_S (470) seconds; a
# step left without time fails the run. Logs go to $OUT (or gpu-bundle/logs) in four files:
# summary.txt, tests.log, sanitizer.log and bench.txt. Exit status 0 only if everything passed.
# Usage: tests/gpu/run.sh [bundle.tar.xz]   (default gpu-bundle/fpa-gpu-bundle.tar.xz)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
archive=${1:-gpu-bundle/fpa-gpu-bundle.tar.xz}
logs=${OUT:-gpu-bundle/logs}
budget=${FPA_GPU_BUDGET_S:-470}
mkdir -p "$logs"
: >"$logs/tests.log"
: >"$logs/sanitizer.log"
: >"$logs/bench.txt"
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }
status=0
summary=()
note() {
  echo "$1"
  summary+=("$1")
}
failed() {
  status=1
  note "$1"
}
finish() {
  {
    echo "===== summary ($(elapsed)s) ====="
    printf '%s\n' "${summary[@]}"
    echo
    cat "$logs/bench.txt"
  } | tee "$logs/summary.txt"
  exit $status
}
# Seconds a step may take: its own cap, or what is left of the budget.
allowance() {
  local left=$((budget - $(elapsed)))
  echo $((left < $1 ? left : $1))
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)
note "gpu: ${gpu:-none (nvidia-smi found no GPU)}"
if [[ ! -f $archive ]]; then
  failed "no bundle at $archive: build it with tests/gpu/bundle.sh and carry gpu-bundle"
  finish
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# tar runs xz for -J; without an xz binary, Python's own lzma unpacks it.
tar -xJf "$archive" -C "$work" 2>/dev/null ||
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$archive" "$work" || { failed "cannot unpack $archive"; finish; }
root=$work/fpa-gpu-bundle
filter=${FPA_GPU_SANITIZE_FILTER:-}
# shellcheck source=/dev/null
source "$root/manifest.sh"
FPA_GPU_SANITIZE_FILTER=${filter:-$FPA_GPU_SANITIZE_FILTER}
unset FPA_VECTORS_DIR  # the bundle's own vectors, found beside its binaries

# The CUDA toolkit's libraries are the device's own; where the loader does not know their folder,
# look for it where the toolkit and PyTorch's CUDA wheels put them.
missing() { ldd "$root"/bin/* 2>&1 | awk '/not found/ {print $1}' | sort -u; }
for lib in $(missing); do
  dir=$(find /usr/local /opt /usr/lib -name "$lib" -printf '%h\n' 2>/dev/null | head -1)
  [[ -n $dir ]] && export LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
if [[ -n $(missing) ]]; then
  failed "libraries missing on this machine:"
  ldd "$root"/bin/* 2>&1 | grep "not found" | sort -u
  finish
fi

# Judges a gtest run from its exit status and log; `may_be_empty` allows a filter that selects
# none of a binary's tests.
judge() {  # label, rc, log, may_be_empty
  local label=$1 rc=$2 log=$3 ran skipped
  ran=$(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran.*/\1/p' "$log" | tail -1)
  skipped=$(sed -nE 's/^\[  SKIPPED \] ([0-9]+) tests?, listed below.*/\1/p' "$log" | tail -1)
  if ((rc == 124 || rc == 137)); then
    failed "$label: FAIL (timed out)"
  elif ((rc != 0)); then
    failed "$label: FAIL (exit $rc)"
    grep -E "Failure|Expected|Which is|actual|step |FAILED|ERROR SUMMARY|RACECHECK SUMMARY" \
      "$log" | head -40
  elif [[ -z $ran ]] || { ((ran == 0)) && [[ -z ${4:-} ]]; }; then
    failed "$label: FAIL (ran no test)"
  elif ((ran == 0)); then
    note "$label: none selected"
  elif ((${skipped:-0} > 0)); then
    failed "$label: FAIL ($skipped skipped: $(grep -m1 -A1 ': Skipped$' "$log" | tail -1))"
  else
    note "$label: PASS ($ran tests)"
  fi
}

for test in $FPA_GPU_TESTS; do
  limit=$(allowance 180)
  if ((limit < 15)); then
    failed "$test: FAIL (not run: out of time)"
    continue
  fi
  timeout -k 10 "$limit" "$root/bin/$test" --gtest_color=no >"$work/$test.log" 2>&1
  rc=$?
  { echo "===== $test (exit $rc)"; cat "$work/$test.log"; } >>"$logs/tests.log"
  judge "$test" $rc "$work/$test.log"
done
echo "tests done at $(elapsed)s"

limit=$(allowance 200)
if ((limit < 15)); then
  failed "$FPA_GPU_BENCH: FAIL (not run: out of time)"
else
  timeout -k 10 "$limit" "$root/bin/$FPA_GPU_BENCH" --steps 8 >"$logs/bench.txt" 2>&1
  rc=$?
  if ((rc == 124 || rc == 137)); then
    failed "$FPA_GPU_BENCH: FAIL (timed out after ${limit}s; its figures so far are below)"
  elif ((rc != 0)); then
    failed "$FPA_GPU_BENCH: FAIL (exit $rc)"
  elif grep -q "no CUDA device" "$logs/bench.txt"; then
    failed "$FPA_GPU_BENCH: FAIL (no CUDA device)"
  else
    note "$FPA_GPU_BENCH: done"
  fi
fi
echo "benchmark done at $(elapsed)s"

sanitizer=$(command -v compute-sanitizer)
for candidate in /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [[ -z $sanitizer && -x $candidate ]] && sanitizer=$candidate
done
if [[ -z $sanitizer ]]; then
  failed "compute-sanitizer: FAIL (not found)"
  finish
fi
for tool in memcheck racecheck; do
  total=0
  for test in $FPA_GPU_TESTS; do
    limit=$(allowance 120)
    if ((limit < 15)); then
      failed "$tool $test: FAIL (not run: out of time)"
      total=-1
      continue
    fi
    log=$work/$tool-$test.log
    FPA_CUDA_SYNC=1 timeout -k 10 "$limit" "$sanitizer" --tool "$tool" --error-exitcode 1 \
      "$root/bin/$test" --gtest_color=no --gtest_filter="$FPA_GPU_SANITIZE_FILTER" >"$log" 2>&1
    rc=$?
    { echo "===== $tool $test (exit $rc)"; cat "$log"; } >>"$logs/sanitizer.log"
    judge "$tool $test" $rc "$log" may_be_empty
    ran=$(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran.*/\1/p' "$log" | tail -1)
    ((total >= 0)) && total=$((total + ${ran:-0}))
  done
  ((total != 0)) || failed "$tool: FAIL (FPA_GPU_SANITIZE_FILTER selected no test)"
done
finish
