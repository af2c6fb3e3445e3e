#!/usr/bin/python3
"""The compute dtypes and weight huge pages side by side, alternating in one run (issue 19).

Each round runs, in this order, `bench-engine` for: decode batch 1 (32 in / 128 out), decode batch
16, prefill of 512 tokens, each with --compute-dtype f32 and bf16; then batch-1 decode with
--no-weight-huge-pages (bf16 and f32); on a CPU with AMX-BF16, the bf16 commands once more with
PDSERVE_AMX=0 (VDPBF16PS); and, with --baseline, the same f32 commands on an older binary. Every figure is a ratio against a limit measured inside the same bench-engine process:
decode against the read bandwidth, prefill against the peak of the instruction it uses.

    /usr/bin/python3 bench/compute_dtype.py --model models/smollm-bf16 --rounds 3 \
        [--baseline /tmp/old/build/pdserve]
"""

import argparse
import json
import os
import subprocess


def bench(pdserve, model, batch, input_len, output_len, extra, env=None):
    cmd = [pdserve, "bench-engine", "--model", model, "--batch", str(batch), "--input-len", str(input_len),
           "--output-len", str(output_len), "--threads", "2", "--kv-memory-gib", "1", "--format", "json",
           "--bw-gib", "1", *extra]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                     env={**os.environ, **(env or {})}).stdout)


def cpu_has_amx():
    with open("/proc/cpuinfo") as f:
        return " amx_bf16" in f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", default="build/pdserve")
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", help="an older pdserve binary (with --compute-dtype f32 when it has the flag)")
    args = ap.parse_args()
    cases = []
    for dtype in ("f32", "bf16"):
        flags = ["--compute-dtype", dtype]
        cases += [(f"decode b1 {dtype}", args.pdserve, 1, 32, 128, flags),
                  (f"decode b16 {dtype}", args.pdserve, 16, 32, 64, flags),
                  (f"prefill 512 {dtype}", args.pdserve, 1, 512, 2, flags),
                  (f"decode b1 {dtype} no huge pages", args.pdserve, 1, 32, 128,
                   flags + ["--no-weight-huge-pages"])]
    amx_off = {"PDSERVE_AMX": "0"}
    if cpu_has_amx():
        flags = ["--compute-dtype", "bf16"]
        cases += [("decode b1 bf16 no AMX", args.pdserve, 1, 32, 128, flags, amx_off),
                  ("decode b16 bf16 no AMX", args.pdserve, 16, 32, 64, flags, amx_off),
                  ("prefill 512 bf16 no AMX", args.pdserve, 1, 512, 2, flags, amx_off)]
    if args.baseline:
        # A build with --compute-dtype defaults to auto (bf16 on a CPU with AVX512-BF16): ask it for f32.
        usage = subprocess.run([args.baseline, "bench-engine", "--help"], capture_output=True, text=True)
        f32 = ["--compute-dtype", "f32"] if "--compute-dtype" in usage.stdout + usage.stderr else []
        cases += [("decode b1 f32 baseline", args.baseline, 1, 32, 128, f32),
                  ("decode b16 f32 baseline", args.baseline, 16, 32, 64, f32),
                  ("prefill 512 f32 baseline", args.baseline, 1, 512, 2, f32)]
    rows = {name: [] for name, *_ in cases}
    for r in range(args.rounds):
        for name, binary, batch, inp, out, extra, *env in cases:
            j = bench(binary, args.model, batch, inp, out, extra, *env)
            rows[name].append(j)
            if name.startswith("prefill"):
                peak = j.get("prefill_peak_ratio")
                print(f"round {r} {name:34s} {j['prefill_tok_s']:8.1f} tok/s  {j['prefill_gflops']:6.1f} GFLOP/s"
                      f"  sgemm {j['prefill_flops_ratio']:.2f}"
                      + (f"  {j['prefill_instruction']} peak {peak:.2f}" if peak is not None else ""), flush=True)
            else:
                median = j.get("decode_bw_ratio_median_step")
                print(f"round {r} {name:34s} {j['decode_tok_s']:8.1f} tok/s  {j['decode_effective_gbs']:6.2f} GB/s"
                      f"  read BW {j['read_bw_gbs']:5.1f}  ratio {j['decode_bw_ratio']:.2f}"
                      + (f" (median step {median:.2f})" if median is not None else ""), flush=True)
    print()
    print("| case | tok/s | ratio | median-step ratio | round by round |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in rows.items():
        key = "prefill_tok_s" if name.startswith("prefill") else "decode_tok_s"
        ratio = "prefill_peak_ratio" if name.startswith("prefill") else "decode_bw_ratio"
        toks = [j[key] for j in runs]
        ratios = [j.get(ratio, j.get("prefill_flops_ratio")) for j in runs]
        medians = [j.get("decode_bw_ratio_median_step") for j in runs if not name.startswith("prefill")]
        median = (f"{min(medians):.2f}-{max(medians):.2f}" if medians and None not in medians else "")
        print(f"| {name} | {min(toks):.1f}-{max(toks):.1f} | {min(ratios):.2f}-{max(ratios):.2f} | {median} | "
              + ", ".join(f"{t:.1f}" for t in toks) + " |")
    for dtype in ("f32", "bf16"):
        b16 = [j["decode_tok_s"] for j in rows[f"decode b16 {dtype}"]]
        b1 = [j["decode_tok_s"] for j in rows[f"decode b1 {dtype}"]]
        print(f"batch 16 / batch 1 ({dtype}), per round: " + ", ".join(f"{a / b:.1f}x" for a, b in zip(b16, b1)))
    pf = [j["prefill_tok_s"] for j in rows["prefill 512 f32"]]
    pb = [j["prefill_tok_s"] for j in rows["prefill 512 bf16"]]
    print("prefill bf16 / f32, per round: " + ", ".join(f"{b / f:.2f}x" for f, b in zip(pf, pb)))
    if "prefill 512 bf16 no AMX" in rows:
        pv = [j["prefill_tok_s"] for j in rows["prefill 512 bf16 no AMX"]]
        print("prefill bf16 AMX / VDPBF16PS, per round: " + ", ".join(f"{b / v:.2f}x" for v, b in zip(pv, pb)))
        print("prefill bf16 VDPBF16PS / f32, per round: " + ", ".join(f"{v / f:.2f}x" for f, v in zip(pf, pv)))
    if args.baseline:
        for what, key in (("decode b1", "decode_tok_s"), ("decode b16", "decode_tok_s"), ("prefill 512", "prefill_tok_s")):
            new = [j[key] for j in rows[f"{what} f32"]]
            old = [j[key] for j in rows[f"{what} f32 baseline"]]
            print(f"{what} f32 new / baseline, per round: " + ", ".join(f"{n / o:.2f}x" for n, o in zip(new, old)))
    print("cpu:", rows[cases[0][0]][0]["cpu"])


if __name__ == "__main__":
    main()
