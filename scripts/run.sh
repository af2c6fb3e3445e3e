#!/usr/bin/env bash
# Installs what is missing, builds, and starts `pdserve serve` (router + prefill + decode in one
# process) on 127.0.0.1:8000. With no --model it makes a small random model under models/demo
# (once) and serves that; it then sends one request to show the server answering. Ctrl-C stops it.
# Arguments go to `pdserve serve`, e.g.
#   scripts/run.sh --model /path/to/Qwen2.5-0.5B-Instruct --listen 0.0.0.0:8000
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh >&2
BIN="${PDSERVE_BUILD_DIR:-build}/pdserve"
ARGS=("$@")
if [[ " $* " != *" --model "* ]]; then
  MODEL=models/demo
  if [ ! -f "$MODEL/config.json" ]; then
    "$BIN" make-model "$MODEL" --arch llama --layers 4 --hidden 256 --heads 8 --kv-heads 2 \
      --intermediate 768 --vocab 768 --dtype bf16 --seed 1 >&2
  fi
  ARGS+=(--model "$MODEL" --kv-memory-gib 0.25)
fi
if [[ " $* " != *" --listen "* ]]; then ARGS+=(--listen 127.0.0.1:8000); fi

READY=$(mktemp)
"$BIN" serve "${ARGS[@]}" > "$READY" &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER; rm -f "$READY"' EXIT
for _ in $(seq 1 600); do
  grep -q "ready:" "$READY" && break
  kill -0 $SERVER 2>/dev/null || { echo "pdserve serve failed to start" >&2; exit 1; }
  sleep 0.1
done
cat "$READY" >&2
ADDRESS=$(grep -o "grpc=[^ ]*" "$READY" | cut -d= -f2)
echo "demo request (random weights give gibberish text; the tokens are real):" >&2
"$BIN" generate --server "$ADDRESS" --prompt "The quick brown fox" --max-tokens 24 \
  --temperature 0 --ignore-eos --format json
echo "serving on $ADDRESS -- try: $BIN generate --server $ADDRESS --prompt 'Hello'   (Ctrl-C to stop)" >&2
wait $SERVER
