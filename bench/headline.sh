#!/usr/bin/env bash
# The headline run: bench/passkey.py through a live fpa-serve for each model, the cache-bytes
# curve of one long request on the first model, and the plots. Each server listens on loopback
# and is stopped at the end; the first model also runs the held-out filler and question
# (--prompt-set heldout, full cache and fpa). Usage: bench/headline.sh [MODEL_DIR ...] (default:
# the three second-generation models). Env: BUILD (build dir, default build), SAMPLES and DEPTHS
# (default 4 prompts at each of 11 depths: 44 a length), LENGTHS, BUDGETS (default auto: each
# heuristic at the share of the cache fpa held), OUT (bench/out).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out}
models=("$@")
((${#models[@]})) || models=(models/fpa-v2 models/fox-v2 models/softmax-v2)
depths=${DEPTHS:-0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1}
mkdir -p "$OUT"
port=50251
jsons=()
for m in "${models[@]}"; do
  name=$(basename "$m")
  "$BUILD/server/fpa-serve" --model "$m" --address "127.0.0.1:$port" \
    --metrics-address 127.0.0.1:0 --http-address 127.0.0.1:0 --max-prompt-tokens 16384 \
    >"$OUT/$name.server.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  for _ in $(seq 100); do grep -q "listening" "$OUT/$name.server.log" && break; sleep 0.2; done
  /usr/bin/python3 bench/passkey.py --address "127.0.0.1:$port" --stubs "$BUILD/proto/python" \
    --lengths "${LENGTHS:-1,2,4,8}" --depths "$depths" --samples "${SAMPLES:-4}" \
    --budgets "${BUDGETS:-auto}" --time-limit 3600 --json "$OUT/$name.json" --markdown
  if [[ "$m" == "${models[0]}" ]]; then
    /usr/bin/python3 bench/passkey.py --address "127.0.0.1:$port" --stubs "$BUILD/proto/python" \
      --lengths "${LENGTHS:-1,2,4,8}" --depths "$depths" --samples "${SAMPLES:-4}" \
      --prompt-set heldout --policies none,fpa --time-limit 3600 \
      --json "$OUT/$name-heldout.json" --markdown
    /usr/bin/python3 bench/cache_curve.py --address "127.0.0.1:$port" \
      --stubs "$BUILD/proto/python" --json "$OUT/curve.json" >/dev/null
  fi
  kill $pid; wait $pid 2>/dev/null || true
  jsons+=("$OUT/$name.json")
done
/usr/bin/python3 bench/plot_passkey.py --passkey "${jsons[@]}" --curve "$OUT/curve.json" \
  --out-dir bench
