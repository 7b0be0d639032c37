#!/bin/sh
# Runs one libFuzzer target for a bounded time from the committed seeds; new inputs go to a
# scratch folder, never into the source tree. Any crash, leak or sanitizer report fails the run.
#   run_fuzzer.sh BINARY SEEDS SCRATCH SECONDS MAX_LEN
# FPA_FUZZ_SECONDS in the environment overrides SECONDS (the fresh-machine check's short runs).
set -eu
bin=$1 seeds=$2 scratch=$3 seconds=${FPA_FUZZ_SECONDS:-$4} max_len=$5
mkdir -p "$scratch/corpus" "$scratch/artifacts"
exec "$bin" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 -timeout=20 \
  -print_final_stats=1 -artifact_prefix="$scratch/artifacts/" "$scratch/corpus" "$seeds"
