#!/usr/bin/env bash
# Configures build/ and builds the given targets (default: everything, CUDA too when nvcc is
# found). scripts/serve builds only the server; scripts/test builds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths relative to the checkout, so ccache serves another clone of the same sources.
export CCACHE_BASEDIR="$PWD"
# FPA_TSAN_TESTS explicitly: a build folder configured before it defaulted to ON keeps OFF cached.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFPA_TSAN_TESTS=ON >/dev/null
if (($#)); then
  cmake --build build -j"$(nproc)" --target "$@"
else
  cmake --build build -j"$(nproc)"
fi
