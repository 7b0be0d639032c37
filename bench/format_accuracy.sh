#!/usr/bin/env bash
# What each CPU format costs the model in accuracy (issue 26): per-token perplexity on the
# held-out set (build/bench/fpa-perplexity, full cache and FPA eviction, with the live-key
# fraction) and passkey accuracy at 1x-8x through a live fpa-serve (bench/passkey.py, full cache
# and fpa), for each --cpu-weights/--kv-dtype pair. Not timing: any machine will do.
# Usage: bench/format_accuracy.sh [MODEL_DIR] (default models/fpa-v2). Env: BUILD (build), OUT
# (bench/out/formats), FORMATS ("f32/f32 bf16/f32 int8/f32 int8/bf16"), SAMPLES (2 prompts per
# depth), DEPTHS (0,0.25,0.5,0.75,1), THREADS (the server's, 2).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out/formats}
model=${1:-models/fpa-v2}
mkdir -p "$OUT"
/usr/bin/python3 -c "import sys; sys.path.insert(0, 'train'); from data import heldout_tokens
print(*heldout_tokens())" >"$OUT/heldout.txt"
port=50351
for f in ${FORMATS:-f32/f32 bf16/f32 int8/f32 int8/bf16}; do
  w=${f%/*} kv=${f#*/}
  for evict in false true; do
    "$BUILD/bench/fpa-perplexity" --model "$model" --tokens "$OUT/heldout.txt" --cpu_weights "$w" \
      --kv_dtype "$kv" --evict="$evict" --threads 1 --batch 16
  done | tee "$OUT/ppl-$w-$kv.jsonl"
  log="$OUT/server-$w-$kv.log"
  "$BUILD/server/fpa-serve" --model "$model" --cpu-weights "$w" --kv-dtype "$kv" \
    --threads "${THREADS:-2}" --address "127.0.0.1:$port" --metrics-address 127.0.0.1:0 \
    --http-address 127.0.0.1:0 --max-prompt-tokens 16384 >"$log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  for _ in $(seq 100); do grep -q "listening" "$log" && break; sleep 0.2; done
  /usr/bin/python3 bench/passkey.py --address "127.0.0.1:$port" --stubs "$BUILD/proto/python" \
    --lengths 1,2,4,8 --depths "${DEPTHS:-0,0.25,0.5,0.75,1}" --samples "${SAMPLES:-2}" \
    --policies none,fpa --json "$OUT/passkey-$w-$kv.json" --markdown
  kill $pid
  wait $pid 2>/dev/null || true
done
