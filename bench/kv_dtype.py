#!/usr/bin/python3
"""The KV cache dtypes side by side (issue 20): decode speed with a long context, and what a
request moves between the tiers.

Decode: `bench-engine` with a 2,048-token context at batch 1 and batch 16, for each --kv-dtype,
alternating within each round, so the dtypes share the machine's state; each figure is also
reported against bf16 in the same round. Tiers: `pdserve bench` on a fresh local cluster (one
prefill, one decode worker) per dtype: TTFT and the KV bytes the decode worker received per
request.

    /usr/bin/python3 bench/kv_dtype.py --model models/smollm-bf16 --rounds 2
"""

import argparse
import json
import subprocess

DTYPES = ("f32", "bf16", "int8", "int4")


def bench_engine(pdserve, model, batch, input_len, output_len, dtype):
    cmd = [pdserve, "bench-engine", "--model", model, "--batch", str(batch), "--input-len", str(input_len),
           "--output-len", str(output_len), "--threads", "2", "--kv-memory-gib", "3", "--format", "json",
           "--bw-gib", "1", "--kv-dtype", dtype]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def bench_tiers(pdserve, model, dtype, prompts, input_len, rate):
    cmd = [pdserve, "bench", "--model", model, "--compare-policies", "kv_aware", "--prefill", "1",
           "--decode", "1", "--worker-flags", f"--threads 1 --kv-memory-gib 1 --kv-dtype {dtype}",
           "--router-flags", f"--kv-dtype {dtype}", "--num-prompts", str(prompts), "--input-len",
           str(input_len), "--output-len", "8", "--request-rate", str(rate), "--local-prefill-tokens", "0",
           "--format", "json"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", default="build/pdserve")
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--tier-prompts", type=int, default=4)
    ap.add_argument("--tier-input-len", type=int, default=1024)
    ap.add_argument("--tier-rate", type=float, default=0.1,
                    help="requests/s: low enough that a prompt's prefill does not queue behind another")
    ap.add_argument("--parts", default="decode,tiers")
    args = ap.parse_args()
    if "decode" in args.parts:
        decode(args)
    if "tiers" in args.parts:
        tiers(args)


def decode(args):
    print("| round | kv dtype | decode b1 tok/s | vs bf16 | decode b16 tok/s | vs bf16 | KV bytes/token |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in range(args.rounds):
        got = {}
        for dtype in DTYPES:
            b1 = bench_engine(args.pdserve, args.model, 1, args.context, 64, dtype)
            b16 = bench_engine(args.pdserve, args.model, 16, args.context, 16, dtype)
            got[dtype] = (b1["decode_tok_s"], b16["decode_tok_s"],
                          b1["kv_bytes_per_token"])
        for dtype in DTYPES:
            b1, b16, bpt = got[dtype]
            print(f"| {r + 1} | {dtype} | {b1:.1f} | {b1 / got['bf16'][0]:.2f} | {b16:.1f} "
                  f"| {b16 / got['bf16'][1]:.2f} | {bpt} |", flush=True)


def tiers(args):
    print()
    print("| kv dtype | requests | KV bytes received per request | vs bf16 | TTFT p50 ms | TTFT mean ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    got = {d: bench_tiers(args.pdserve, args.model, d, args.tier_prompts, args.tier_input_len, args.tier_rate)
           for d in DTYPES}
    for dtype in DTYPES:
        t = got[dtype]
        per = t["kv_transfer_bytes"] / max(1, t["remote_prefills"])
        ref = got["bf16"]["kv_transfer_bytes"] / max(1, got["bf16"]["remote_prefills"])
        print(f"| {dtype} | {t['ok']} | {per:.0f} | {per / ref:.4f} | {t['ttft_p50_ms']:.1f} "
              f"| {t['ttft_mean_ms']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
