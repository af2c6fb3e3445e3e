#!/usr/bin/env bash
# Installs what building and running need (setup.sh --run), builds the pdserve binary only (the
# tests are test.sh's), and starts `pdserve serve` (router + prefill + decode in one process) on
# 127.0.0.1:8000, with the OpenAI-compatible HTTP API on 127.0.0.1:8080 and metrics on :9400. With no --model it serves the trained demo model that ships in
# models/pdserve-demo (a 4M-parameter Llama trained on the King James Bible), and its LoRA adapter
# models/pdserve-demo-lora as the model "psalms"; it then sends one
# request to show the server answering. Ctrl-C stops it. Arguments go to `pdserve serve`, e.g.
#   scripts/run.sh --model /path/to/Qwen2.5-0.5B-Instruct --listen 0.0.0.0:8000
set -euo pipefail
cd "$(dirname "$0")/.."

# The demo and other CPU models need no CUDA backend (its kernels took ~140 of a cold build's
# ~1,200 CPU-seconds, one file alone 100 s, the last to finish):
# built only when the arguments ask for --device cuda.
cuda=OFF
if [[ " $* " == *" --device cuda"* || " $* " == *" --device=cuda"* ]]; then cuda=AUTO; fi
PDSERVE_CUDA="${PDSERVE_CUDA:-$cuda}" PDSERVE_SETUP_ARGS=--run PDSERVE_TARGETS=pdserve scripts/build.sh >&2
BIN="${PDSERVE_BUILD_DIR:-build}/pdserve"
ARGS=("$@")
if [[ " $* " != *" --model "* ]]; then
  # The demo model ships no chat template: the one in tests/chat/ serves /v1/chat/completions.
  # Its LoRA adapter, trained on the Psalms, is served beside it as the model "psalms".
  ARGS+=(--model models/pdserve-demo --kv-memory-gib 0.25 --chat-template tests/chat/inst_template.jinja
         --lora-modules psalms=models/pdserve-demo-lora)
fi
if [[ " $* " != *" --listen "* ]]; then ARGS+=(--listen 127.0.0.1:8000); fi
if [[ " $* " != *" --http-listen "* ]]; then ARGS+=(--http-listen 127.0.0.1:8080); fi
if [[ " $* " != *" --metrics-listen "* ]]; then ARGS+=(--metrics-listen 127.0.0.1:9400); fi

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
echo >&2
HTTP=$(grep -o "http=[^ ]*" "$READY" | cut -d= -f2)
METRICS=$(grep -o "metrics=[^ ]*" "$READY" | cut -d= -f2)
cat >&2 <<EOF

Serving on $ADDRESS (Ctrl-C stops it). Three things to try from another terminal:
  1. Another prompt:  $BIN generate --server $ADDRESS --prompt 'And it came to pass' --max-tokens 40
  2. The OpenAI API:  curl -s http://$HTTP/v1/completions -H 'Content-Type: application/json' \\
                        -d '{"model": "pdserve-demo", "prompt": "Blessed are", "max_tokens": 24}'
  3. Its metrics:     curl -s http://$METRICS/metrics | grep pdserve_generation_tokens_total
                      (the Grafana dashboard that reads them: deploy/k8s/grafana/pdserve-dashboard.json)
README's "A ten-minute tour" goes on from here.
EOF
wait $SERVER
