#!/usr/bin/env bash
# Configures and builds everything into build/ (CUDA too when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths relative to the checkout, so ccache serves another clone of the same sources.
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
