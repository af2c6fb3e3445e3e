#!/usr/bin/python3
"""Two pdserve builds side by side, alternating in one run (the order reversed every round).

Each round runs `bench-engine` on both builds for the chosen cases (decode batch 1: 32 in / 128
out; decode batch 16: 32 in / 64 out; prefill: --prefill-len tokens) with one compute dtype, and
prints tok/s per build and the ratio new / old. Absolute figures on a shared machine mean little;
the ratios within a round are the result.

    /usr/bin/python3 bench/ab_builds.py --old /tmp/old/pdserve --new build/pdserve \
        --model models/smollm-bf16 --compute-dtype bf16 --rounds 3 --cases b1,b16,prefill
"""

import argparse
import json
import subprocess

CASES = {"b1": (1, 32, 128, "decode_tok_s"), "b16": (16, 32, 64, "decode_tok_s"),
         "prefill": (1, None, 2, "prefill_tok_s")}


def bench(pdserve, model, batch, input_len, output_len, dtype):
    cmd = [pdserve, "bench-engine", "--model", model, "--batch", str(batch), "--input-len", str(input_len),
           "--output-len", str(output_len), "--threads", "2", "--kv-memory-gib", "1", "--format", "json",
           "--bw-gib", "0.25", "--compute-dtype", dtype]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default="build/pdserve")
    ap.add_argument("--model", required=True)
    ap.add_argument("--compute-dtype", default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="b1,b16,prefill")
    ap.add_argument("--prefill-len", type=int, default=512)
    args = ap.parse_args()
    cases = args.cases.split(",")
    for r in range(args.rounds):
        order = [("old", args.old), ("new", args.new)]
        if r % 2:
            order.reverse()
        for case in cases:
            batch, input_len, output_len, key = CASES[case]
            input_len = input_len or args.prefill_len
            got = {name: bench(binary, args.model, batch, input_len, output_len, args.compute_dtype)[key]
                   for name, binary in order}
            print(f"round {r} {case:8s} old {got['old']:8.1f}  new {got['new']:8.1f}  "
                  f"new/old {got['new'] / got['old']:.2f}  ({' then '.join(n for n, _ in order)})", flush=True)


if __name__ == "__main__":
    main()
