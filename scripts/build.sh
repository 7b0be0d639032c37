#!/usr/bin/env bash
# Configures build/ and builds the given targets (default: everything, CUDA too when nvcc is
# found). scripts/serve builds only the server; scripts/test builds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths relative to the checkout, so ccache serves another clone of the same sources.
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
if (($#)); then
  cmake --build build -j"$(nproc)" --target "$@"
else
  cmake --build build -j"$(nproc)"
fi
