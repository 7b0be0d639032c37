#!/usr/bin/env bash
# Builds, here, everything tests/gpu/run.sh needs on the device machine, which has the CUDA
# toolkit but none of this project's other libraries, no package registry and no network:
# - the GPU test binaries (FPA_GPU_TESTS in tests/gpu/CMakeLists.txt) and cuda_decode_bench,
#   for sm_80 and sm_90, without -march=native (the device's CPU is not this one), in build-bundle/;
# - every shared library they load that the device lacks (tests/gpu/device_libs.txt lists what it
#   has), beside them in lib/: the binaries' RPATH is $ORIGIN/../lib, an RPATH rather than a
#   RUNPATH so that the libraries' own dependencies (OpenBLAS's libgfortran) are found there too;
# - tests/vectors and the model folders the vectors name, laid out as in the repository.
# All of it goes into one xz'd tar, gpu-bundle/fpa-gpu-bundle.tar.xz: the device tool carries
# the working tree and the bundle in 64 MiB, and OpenBLAS alone is 36 MB unpacked, 11 MB packed.
# Carry `gpu-bundle` and run tests/gpu/run.sh there. tests/gpu/bundle_check.sh checks the result.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="build-bundle"
name=fpa-gpu-bundle
stage=$build/stage/$name
out=gpu-bundle

nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x $nvcc ]] || { echo "bundle.sh: no nvcc here: the bundle needs the CUDA build" >&2; exit 1; }
launchers=()
if command -v ccache >/dev/null; then
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2016  # $ORIGIN is for the loader, not the shell
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFPA_NATIVE=OFF \
  -DFPA_CUDA_ARCHS="80;90" -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags "${launchers[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)" --target gpu_bundle_binaries

manifest=$build/tests/gpu/bundle-manifest.sh
# shellcheck source=/dev/null
source "$manifest"
# A set, not `printf | grep -q`: under pipefail grep's early exit can fail the pipe (SIGPIPE).
declare -A device_libs
while read -r soname; do device_libs[$soname]=1; done < <(grep -v '^#' tests/gpu/device_libs.txt)
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/tests"
cp "$manifest" "$stage/manifest.sh"
for bin in $FPA_GPU_TESTS $FPA_GPU_BENCH; do
  cp "$build/tests/gpu/$bin" "$stage/bin/"
  # ldd lists what the binary loads, its libraries' libraries too.
  while read -r soname path; do
    [[ -v device_libs[$soname] ]] && continue
    [[ -e $stage/lib/$soname ]] && continue
    [[ -f $path ]] || { echo "bundle.sh: $bin needs $soname, not found here" >&2; exit 1; }
    cp -L "$path" "$stage/lib/$soname"
  done < <(ldd "$stage/bin/$bin" | awk '$2 == "=>" {print $1, $3; next} {n = split($1, p, "/"); print p[n]}')
done

cp -r tests/vectors "$stage/tests/"
# A case without its own model names one by its path from the repository root.
for case in tests/vectors/*/case.safetensors; do
  model=$(head -c 65536 "$case" | grep -ao '"model_dir":"[^"]*"' | cut -d'"' -f4 || true)
  [[ -z $model ]] && continue
  mkdir -p "$stage/$(dirname "$model")"
  cp -r "$model" "$stage/$model"
done

mkdir -p "$out"
# The gzip'd bundle of earlier builds would travel beside it (the device tool carries gpu-bundle/).
rm -f "$out/$name.tar.gz"
# xz, not gzip: oneDNN (40 MB unpacked) packs to 7 MB instead of 11, which keeps the bundle and
# the working tree within the device tool's 64 MiB.
tar -C "$build/stage" -cf - "$name" | xz -T0 -6 >"$out/$name.tar.xz.tmp"
mv "$out/$name.tar.xz.tmp" "$out/$name.tar.xz"
echo "bundle: $out/$name.tar.xz ($(du -k "$out/$name.tar.xz" | cut -f1) KiB packed, $(du -sk "$stage" | cut -f1) KiB unpacked)"
