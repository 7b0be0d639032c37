#!/usr/bin/env bash
# Installs the pinned OpenAI client (package-lock.json) when missing or stale, then runs the
# tests against a live fpa-serve (FPA_SERVE_BIN, or build/server/fpa-serve).
set -euo pipefail
cd "$(dirname "$0")"
stamp=node_modules/.fpa-installed-lock
if ! cmp -s package-lock.json "$stamp"; then
  npm ci --no-audit --no-fund
  cp package-lock.json "$stamp"
fi
exec node --test --test-concurrency=1 test_openai.mjs
