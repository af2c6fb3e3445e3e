#!/usr/bin/env bash
# Installs what is missing, builds, and runs pdserve on an embedded default: with no arguments it
# makes a small random model under models/demo (once) and generates from it. Any arguments are
# passed to `pdserve generate` instead, e.g.
#   scripts/run.sh --model /path/to/Qwen2.5-0.5B --prompt "Hello" --max-tokens 32
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh >&2
BUILD_DIR="${PDSERVE_BUILD_DIR:-build}"
if [ $# -gt 0 ]; then
  exec "$BUILD_DIR/pdserve" generate "$@"
fi
MODEL=models/demo
if [ ! -f "$MODEL/config.json" ]; then
  "$BUILD_DIR/pdserve" make-model "$MODEL" --arch llama --layers 4 --hidden 256 --heads 8 \
    --kv-heads 2 --intermediate 768 --vocab 768 --dtype bf16 --seed 1 >&2
fi
echo "pdserve generate on $MODEL (random weights: the text is gibberish, the tokens are real)" >&2
exec "$BUILD_DIR/pdserve" generate --model "$MODEL" --prompt "The quick brown fox" \
  --max-tokens 24 --temperature 0 --ignore-eos --format json --kv-memory-gib 0.25
