#!/usr/bin/env bash
# Installs what is missing, builds, and starts `pdserve serve` (router + prefill + decode in one
# process) on 127.0.0.1:8000. With no --model it serves the trained demo model that ships in
# models/pdserve-demo (a 4M-parameter Llama trained on the King James Bible); it then sends one
# request to show the server answering. Ctrl-C stops it. Arguments go to `pdserve serve`, e.g.
#   scripts/run.sh --model /path/to/Qwen2.5-0.5B-Instruct --listen 0.0.0.0:8000
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh >&2
BIN="${PDSERVE_BUILD_DIR:-build}/pdserve"
ARGS=("$@")
if [[ " $* " != *" --model "* ]]; then
  ARGS+=(--model models/pdserve-demo --kv-memory-gib 0.25)
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
echo "demo request:" >&2
"$BIN" generate --server "$ADDRESS" --prompt "In the beginning God created" --max-tokens 32 \
  --temperature 0
echo "serving on $ADDRESS -- try: $BIN generate --server $ADDRESS --prompt 'And it came to pass'   (Ctrl-C to stop)" >&2
wait $SERVER
