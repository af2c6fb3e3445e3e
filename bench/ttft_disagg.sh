#!/usr/bin/env bash
# TTFT through the disaggregated path (router + prefill worker + decode worker, KV pages over
# tcp, or KV_TRANSPORT) against `pdserve serve` (the same engines in one process), same model,
# same prompts, one request at a time, measured in one run. Prints both `pdserve bench`
# summaries and the ratio.
#
#   bench/ttft_disagg.sh MODEL_DIR [INPUT_LEN] [NUM_PROMPTS] [THREADS]
#   KV_TRANSPORT=ucx UCX_TLS=sm,self bench/ttft_disagg.sh MODEL_DIR 1024 6 2
set -euo pipefail
model=$1
input_len=${2:-1024}
prompts=${3:-8}
threads=${4:-2}
bin=${PDSERVE:-build/pdserve}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# start NAME ARGS...: runs pdserve ARGS in the background, waits for its ready line and sets
# `addr` to its gRPC address. It runs in this shell, not in $(...), so that its pid reaches
# `pids` and the EXIT trap stops it (in a subshell the pid was lost and the processes outlived
# the script).
start() {
  local name=$1
  shift
  "$bin" "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
  pids+=($!)
  for _ in $(seq 600); do
    if grep -q "ready:" "$dir/$name.out"; then
      addr=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' "$dir/$name.out")
      return
    fi
    sleep 0.1
  done
  echo "ttft_disagg: $name did not start: $(tail -5 "$dir/$name.err")" >&2
  exit 1
}
engine=(--model "$model" --threads "$threads" --kv-memory-gib 1)
bench=(--workload random --input-len "$input_len" --output-len 2 --num-prompts "$prompts"
       --max-concurrency 1 --seed 3 --format json)

# Disaggregated: every prompt is longer than --local-prefill-tokens, so each goes to the prefill
# worker and its KV pages cross tcp. Prefix caching off on both tiers: every request is a fresh
# prefill (the prompts are random anyway).
transport=(--transport "${KV_TRANSPORT:-tcp}")
start prefill prefill --listen 127.0.0.1:0 "${engine[@]}" "${transport[@]}" --no-enable-prefix-caching
prefill=$addr
start decode decode --listen 127.0.0.1:0 "${engine[@]}" "${transport[@]}" --no-enable-prefix-caching
decode=$addr
start router router --listen 127.0.0.1:0 --model "$model" --prefill "$prefill" --decode "$decode"
router=$addr
"$bin" bench --server "$router" "${bench[@]}" >"$dir/disagg.json"
for p in "${pids[@]}"; do kill "$p"; done
wait 2>/dev/null || true
pids=()

start serve serve --listen 127.0.0.1:0 "${engine[@]}" --no-enable-prefix-caching
serve=$addr
"$bin" bench --server "$serve" "${bench[@]}" >"$dir/serve.json"

python3 - "$dir/disagg.json" "$dir/serve.json" "${KV_TRANSPORT:-tcp}" <<'PY'
import json, sys
d, s = (json.load(open(p))[0] for p in sys.argv[1:3])
for name, r in ((f"disaggregated ({sys.argv[3]})", d), ("serve (one process)", s)):
    print(f"{name:22s} TTFT mean {r['ttft_mean_ms']:8.1f} ms  p50 {r['ttft_p50_ms']:8.1f} ms  "
          f"p99 {r['ttft_p99_ms']:8.1f} ms  ok {int(r['ok'])}/{int(r['ok'] + r['failed'])}  "
          f"remote prefills {r.get('remote_prefills', '-')}")
print(f"TTFT ratio disaggregated / serve: mean {d['ttft_mean_ms'] / s['ttft_mean_ms']:.3f}, "
      f"p50 {d['ttft_p50_ms'] / s['ttft_p50_ms']:.3f}")
PY
