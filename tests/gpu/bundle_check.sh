#!/usr/bin/env bash
# ctest gpu_bundle_complete: builds the device bundle (tests/gpu/bundle.sh, incremental) and checks
# that it would run on the device machine as it stands, with nothing installed there:
# - every shared library a bundled binary or library needs is in the bundle's lib/ or is one the
#   device has (tests/gpu/device_libs.txt), and the loader finds the bundled ones in lib/ (RPATH);
# - the vectors and the model folders they name are there, byte for byte;
# - the bundled binaries run here from the unpacked bundle (cuda_plan_test whole, the parity
#   test's device-independent test), reading the bundle's vectors;
# - the bundle and the working tree fit together in the device tool's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
tests/gpu/bundle.sh
archive=gpu-bundle/fpa-gpu-bundle.tar.xz
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xJf "$archive" -C "$tmp"
root=$tmp/fpa-gpu-bundle
errors=0
fail() { echo "FAIL: $*"; errors=$((errors + 1)); }

# shellcheck source=/dev/null
source "$root/manifest.sh"
# A set, not `printf | grep -q`: under pipefail grep's early exit can fail the pipe (SIGPIPE).
declare -A device_libs
while read -r soname; do device_libs[$soname]=1; done < <(grep -v '^#' tests/gpu/device_libs.txt)
on_device() { [[ -v device_libs[$1] ]]; }

read -ra binaries <<<"$FPA_GPU_TESTS $FPA_GPU_BENCH"
for bin in "${binaries[@]}"; do
  [[ -x $root/bin/$bin ]] || fail "$bin is not in the bundle"
done
for elf in "$root"/bin/* "$root"/lib/*; do
  while read -r needed; do
    on_device "$needed" || [[ -f $root/lib/$needed ]] ||
      fail "$(basename "$elf") needs $needed, neither bundled nor on the device"
  done < <(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done
for bin in "$root"/bin/*; do
  dynamic=$(readelf -d "$bin")
  # shellcheck disable=SC2016  # the literal $ORIGIN
  grep -q '(RPATH).*\$ORIGIN/\.\./lib' <<<"$dynamic" ||
    fail "$(basename "$bin") has no RPATH \$ORIGIN/../lib"
  # The bundled copy must win over this machine's, which the device does not have.
  while read -r soname path; do
    on_device "$soname" && continue
    [[ $path == "$root/lib/$soname" ]] || fail "$(basename "$bin") loads $soname from $path"
  done < <(ldd "$bin" | awk '$2 == "=>" {print $1, $3}' | sed "s|$root/bin/\.\./lib|$root/lib|")
done

cases=0
for case in tests/vectors/*/; do
  # Recursive: a folder of cases (tests/vectors/hf) holds whole model directories.
  diff -rq "$case" "$root/$case" >/dev/null || fail "$case differs or is missing in the bundle"
  cases=$((cases + 1))
  [[ -f $case/case.safetensors ]] || continue
  model=$(head -c 65536 "$case/case.safetensors" | grep -ao '"model_dir":"[^"]*"' | cut -d'"' -f4 ||
    true)
  [[ -z $model ]] && continue
  for f in config.json model.safetensors; do
    cmp -s "$model/$f" "$root/$model/$f" || fail "$model/$f (named by $case) is not in the bundle"
  done
done

# From another folder, without FPA_VECTORS_DIR: what run.sh does on the device.
(cd "$tmp" && env -u FPA_VECTORS_DIR "$root/bin/cuda_plan_test" >"$tmp/plan.log" 2>&1) ||
  fail "the bundled cuda_plan_test failed here: $(tail -5 "$tmp/plan.log")"
(cd "$tmp" && env -u FPA_VECTORS_DIR "$root/bin/cuda_parity_test" --gtest_filter='CudaBackend.*' \
  >"$tmp/parity.log" 2>&1) || fail "the bundled cuda_parity_test failed here: $(tail -5 "$tmp/parity.log")"
grep -qxF "vectors: $root/tests/vectors" "$tmp/parity.log" ||
  fail "the bundled cuda_parity_test did not read the bundle's vectors: $(grep '^vectors:' "$tmp/parity.log")"

# What the device tool carries: the working tree (tracked and untracked-not-ignored files) and
# the bundle, 64 MiB in all.
packed=$(stat -c %s "$archive")
tree=0
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
    awk '{s += $1} END {print s + 0}')
fi
limit=$((64 * 1024 * 1024))
((packed + tree <= limit)) ||
  fail "bundle $((packed >> 20)) MiB + working tree $((tree >> 20)) MiB exceed the device tool's 64 MiB"

mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "bundle: ${#binaries[@]} binaries, $(find "$root/lib" -type f | wc -l) libraries, $cases vector cases;" \
  "$(mib "$packed") packed + $(mib "$tree") working tree of 64 MiB"
if ((errors)); then
  echo "gpu bundle incomplete: $errors problem(s)"
  exit 1
fi
echo "gpu bundle complete"
