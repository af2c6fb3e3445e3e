#!/usr/bin/env bash
# Part of the device check (scripts/gpu_check.sh): prefill and decode as two processes on one GPU
# (--device cuda --transport cuda_ipc) behind a router, and `serve --device cuda` (the local
# transport), against `generate --device cuda` (colocated) on the same prompts: the greedy tokens
# must be equal, and the decode worker's metrics must show the pages arrived with no failure.
# Usage: scripts/gpu_tiers_check.sh PDSERVE_BINARY [MODEL_DIR]
# (PDSERVE_CHECK_DEVICE=cpu PDSERVE_CHECK_TRANSPORT=tcp runs the same steps on a CPU machine.)
set -uo pipefail
cd "$(dirname "$0")/.."
PD="$1"
MODEL="${2:-models/pdserve-demo}"
WORK="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

# 40- and 70-token prompts: above the 32 tokens a decode worker prefills itself.
PROMPTS=("$(seq -s, 11 50)" "$(seq -s, 101 170)")
DEVICE="${PDSERVE_CHECK_DEVICE:-cuda}"
TRANSPORT="${PDSERVE_CHECK_TRANSPORT:-cuda_ipc}"
common=(--model "$MODEL" --device "$DEVICE" --kv-memory-gib 2 --kv-dtype bf16)
for i in 0 1; do
  "$PD" generate "${common[@]}" --prompt-ids "${PROMPTS[$i]}" --max-tokens 32 --temperature 0 \
    --ignore-eos --format json > "$WORK/colocated$i.json" 2> "$WORK/colocated$i.log" || {
    echo "gpu_tiers_check: colocated generate failed:"; tail -5 "$WORK/colocated$i.log"; exit 1; }
done

"$PD" decode "${common[@]}" --transport "$TRANSPORT" --listen 127.0.0.1:18200 \
  --metrics-listen 127.0.0.1:18201 > "$WORK/decode.log" 2>&1 & pids+=($!)
"$PD" prefill "${common[@]}" --transport "$TRANSPORT" --listen 127.0.0.1:18100 > "$WORK/prefill.log" 2>&1 & pids+=($!)
"$PD" router --model "$MODEL" --kv-dtype bf16 --listen 127.0.0.1:18000 --prefill 127.0.0.1:18100 \
  --decode 127.0.0.1:18200 > "$WORK/router.log" 2>&1 & pids+=($!)
ok=0
for i in 0 1; do
  for attempt in $(seq 1 120); do
    if "$PD" generate --server 127.0.0.1:18000 --prompt-ids "${PROMPTS[$i]}" --max-tokens 32 \
        --temperature 0 --ignore-eos --format json > "$WORK/tiers$i.json" 2> "$WORK/tiers$i.log"; then
      break
    fi
    sleep 1
  done
  if python3 - "$WORK/colocated$i.json" "$WORK/tiers$i.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["token_ids"] == b["token_ids"]
print(f"prompt {sys.argv[1][-6]}: colocated and prefill->decode: "
      f"{'equal' if same else 'DIFFERENT'} ({len(a['token_ids'])} tokens)")
if not same:
    print("  colocated:", a["token_ids"]); print("  tiers:    ", b["token_ids"])
sys.exit(0 if same else 1)
PY
  then ok=$((ok + 1)); fi
done
python3 - <<'PY'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:18201/metrics", timeout=5).read().decode()
def total(name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{") or l.startswith(name + " "))
done, fails, pages = total("pdserve_kv_transfers_total"), total("pdserve_kv_transfer_failures_total"), total("pdserve_kv_transfer_pages_total")
print(f"decode worker: {done:.0f} transfers, {pages:.0f} pages, {fails:.0f} failures")
sys.exit(0 if done >= 2 and fails == 0 else 1)
PY
metrics=$?
cleanup
pids=()

# serve: both tiers in one process, the local transport copying GPU to GPU.
"$PD" serve "${common[@]}" --listen 127.0.0.1:18300 > "$WORK/serve.log" 2>&1 & pids+=($!)
for attempt in $(seq 1 120); do
  if "$PD" generate --server 127.0.0.1:18300 --prompt-ids "${PROMPTS[1]}" --max-tokens 32 \
      --temperature 0 --ignore-eos --format json > "$WORK/serve1.json" 2> "$WORK/serve1.log"; then
    break
  fi
  sleep 1
done
python3 - "$WORK/colocated1.json" "$WORK/serve1.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["token_ids"] == b["token_ids"]
print(f"serve (local transport): {'equal' if same else 'DIFFERENT'} to colocated")
sys.exit(0 if same else 1)
PY
served=$?
if [ "$ok" = 2 ] && [ "$metrics" = 0 ] && [ "$served" = 0 ]; then
  echo "gpu_tiers_check: passed"
  exit 0
fi
echo "gpu_tiers_check: FAILED; the workers' logs end with:"
for f in decode prefill router serve; do echo "--- $f"; tail -15 "$WORK/$f.log"; done
exit 1
