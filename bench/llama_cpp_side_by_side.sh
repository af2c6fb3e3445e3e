#!/bin/bash
# pdserve and llama.cpp on the same GGUF files, 2 threads, interleaved rounds (bench/RESULTS.md,
# "Row blocking, Q4_K_M, and llama.cpp side by side"). llama.cpp is built from the npm bundle as
# ../shared/BUILD-NOTES.md says (targets llama-bench, llama-batched-bench).
#   bench/llama_cpp_side_by_side.sh FILE.gguf [FILE.gguf ...]
# Env: LLAMA_BIN (default .cache/llama.cpp/build/bin), PDSERVE (default build/pdserve),
# ROUNDS (default 2), THREADS (default 2), ISAS (default "native"; "native avx2" runs pdserve a
# second time with PDSERVE_KERNEL_ISA=avx2, its AVX2 kernels, in the same round).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
L=${LLAMA_BIN:-$ROOT/.cache/llama.cpp/build/bin}
P=${PDSERVE:-$ROOT/build/pdserve}
T=${THREADS:-2}
PY=/usr/bin/python3
for round in $(seq "${ROUNDS:-2}"); do
  for m in "$@"; do
    # Prefill 512, and decode after a 512-token prompt.
    "$L/llama-bench" -m "$m" -t "$T" -p 512 -n 0 -r 2 -o jsonl 2>/dev/null |
      $PY -c "import json,sys; [print('round $round $m llama.cpp prefill512 %.1f tok/s' % json.loads(l)['avg_ts']) for l in sys.stdin]"
    "$L/llama-bench" -m "$m" -t "$T" -p 0 -n 32 -d 512 -r 2 -o jsonl 2>/dev/null |
      $PY -c "import json,sys; [print('round $round $m llama.cpp decode@512 %.1f tok/s' % json.loads(l)['avg_ts']) for l in sys.stdin]"
    for isa in ${ISAS:-native}; do
      env $([ "$isa" = native ] || echo PDSERVE_KERNEL_ISA=$isa) "$P" bench-engine --model "$m" --threads "$T" \
          --batch 1 --input-len 512 --output-len 32 --kv-memory-gib 1 --compute-dtype f32 --prefill-rounds 1 \
          --bw-every 8 --format json 2>/dev/null |
        $PY -c "import json,sys; j=json.load(sys.stdin); print('round $round $m pdserve[$isa] prefill512 %.1f tok/s decode@512 %.1f tok/s (%.2f of read bandwidth after the run, %.2f of the reads between its steps)' % (j['prefill_tok_s'], j['decode_tok_s'], j['decode_bw_ratio'], j['decode_bw_ratio_between']))"
    done
    # 16 sequences of 64 prompt tokens, 32 generated each.
    "$L/llama-batched-bench" -m "$m" -t "$T" -c 2048 -b 2048 -ub 512 -npp 64 -ntg 32 -npl 16 2>/dev/null |
      $PY -c "import sys; r=[l.split('|') for l in sys.stdin if l.startswith('|')][-1]; print('round $round $m llama.cpp batch16 prefill %s tok/s decode %s tok/s' % (r[6].strip(), r[8].strip()))"
    for isa in ${ISAS:-native}; do
      env $([ "$isa" = native ] || echo PDSERVE_KERNEL_ISA=$isa) "$P" bench-engine --model "$m" --threads "$T" \
          --batch 16 --input-len 64 --output-len 32 --kv-memory-gib 1 --compute-dtype f32 --prefill-rounds 1 \
          --format json 2>/dev/null |
        $PY -c "import json,sys; j=json.load(sys.stdin); print('round $round $m pdserve[$isa] batch16 prefill %.1f tok/s decode %.1f tok/s' % (j['prefill_tok_s'], j['decode_tok_s']))"
    done
  done
done
