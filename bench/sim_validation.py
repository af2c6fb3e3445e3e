"""The capacity simulator against the real processes (issue 40): each case runs the same workload
(same generator and seed, or the same trace lines) through a real local cluster (`pdserve bench
--compare-policies kv_aware`: router, prefill and decode workers as separate processes on
loopback, KV pages over tcp) and through `pdserve simulate` with the model's profile measured on
this machine (`pdserve profile --threads 1`, written once per model into --profile-dir), and
prints TTFT and TPOT p50/p90, the prefix-cache hit rate and the decode workers' local/remote
prefill counts side by side, as a markdown table with sim / real.

Run: /usr/bin/python3 bench/sim_validation.py --pdserve build/pdserve [--cases chat,rag,...]
     [--json runs.json]; --real-from runs.json simulates again against the real figures kept
     there (to compare simulator changes without rerunning the clusters; same machine only).
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRACE = os.path.join(ROOT, "..", "shared", "traces", "mooncake_synthetic_trace.jsonl")

# name: (model key, split (prefill, decode), workload flags shared by bench and simulate, what it is)
CASES = {
    "chat-low": ("smol", (1, 1), "--workload random --input-len 256 --output-len 64 --num-prompts 30 "
                 "--request-rate 0.5", "short chat, 256 in / 64 out, 0.5 req/s, 30 requests"),
    "chat": ("smol", (1, 1), "--workload random --input-len 256 --output-len 64 --num-prompts 60 "
             "--request-rate 1.5", "short chat, 256 in / 64 out, 1.5 req/s, 60 requests"),
    "prefix": ("smol", (1, 2), "--workload shared-prefix --groups 4 --prefix-len 192 --input-len 64 "
               "--output-len 32 --num-prompts 40 --request-rate 1",
               "shared prefix (4 prompts of 192 + 64 own), 32 out, 1 req/s, 40 requests"),
    "rag": ("smol", (1, 1), "--workload random --input-len 1536 --output-len 32 --range-ratio 0.25 "
            "--num-prompts 16 --request-rate 0.25",
            "long-prompt RAG, 1,152-1,920 in / 32 out, 0.25 req/s, 16 requests"),
    "trace": ("smol", (1, 1), f"--workload trace --trace {TRACE} --trace-length-scale 0.03125 "
              "--trace-time-scale 4 --trace-max-requests 40",
              "the shared trace, lengths x 1/32, time x 4 (~1 req/s), first 40 requests"),
    "demo": ("demo", (1, 1), "--workload random --input-len 256 --output-len 64 --num-prompts 120 "
             "--request-rate 8", "pdserve-demo, 256 in / 64 out, 8 req/s, 120 requests"),
}
FIGURES = [("ttft_p50_ms", "TTFT p50"), ("ttft_p90_ms", "TTFT p90"), ("tpot_p50_ms", "TPOT p50"),
           ("tpot_p90_ms", "TPOT p90"), ("hit_rate", "hit rate")]


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout


def model_dir(args, key):
    if key == "demo":
        return os.path.join(ROOT, "models", "pdserve-demo")
    path = os.path.join(args.profile_dir, "smol-bf16")
    if not os.path.isdir(path):  # SmolLM-135M's shape, random bf16 weights.
        run([args.pdserve, "make-model", path, "--arch", "llama", "--layers", "30", "--hidden", "576",
             "--heads", "9", "--kv-heads", "3", "--intermediate", "1536", "--vocab", "49152", "--dtype", "bf16"])
    return path


def profile(args, key, model):
    path = os.path.join(args.profile_dir, f"{key}_t1.json")
    if not os.path.exists(path):
        print(f"sim_validation: profiling {key} (--threads 1)", file=sys.stderr)
        run([args.pdserve, "profile", "--model", model, "--threads", "1", "--out", path])
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", default=os.path.join(ROOT, "build", "pdserve"))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--profile-dir", default="/tmp/pdserve_sim_validation")
    ap.add_argument("--json", help="also write every figure here")
    ap.add_argument("--real-from", help="a --json file of an earlier run: its real figures, not new runs")
    args = ap.parse_args()
    kept = {}
    if args.real_from:
        with open(args.real_from) as f:
            kept = {r["case"]: r["real"] for r in json.load(f)}
    os.makedirs(args.profile_dir, exist_ok=True)
    rows = []
    for name in args.cases.split(","):
        key, (p, d), workload, what = CASES[name]
        model = model_dir(args, key)
        prof = profile(args, key, model)
        flags = workload.split()
        if name in kept:
            real = kept[name]
        else:
            print(f"sim_validation: {name}: real cluster", file=sys.stderr)
            real = json.loads(run([args.pdserve, "bench", "--compare-policies", "kv_aware", "--model", model,
                                   "--prefill", str(p), "--decode", str(d), "--worker-flags", "--threads 1",
                                   "--format", "json", *flags]))[0]
        sim = json.loads(run([args.pdserve, "simulate", "--profile", prof, "--model", model,
                              "--prefill", str(p), "--decode", str(d), "--policy", "kv_aware",
                              "--format", "json", *flags]))
        sim = sim[0] if isinstance(sim, list) else sim
        rows.append({"case": name, "what": what, "split": f"{p}P{d}D", "real": real, "sim": sim})
        print(f"sim_validation: {name}: real TTFT p50 {real['ttft_p50_ms']:.1f}, simulated "
              f"{sim['ttft_p50_ms']:.1f}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("| case | figure | real | simulated | sim / real |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        first = True
        for key, label in FIGURES:
            a, b = r["real"].get(key), r["sim"].get(key)
            if a is None or b is None:
                continue
            ratio = "exact" if a == b else (f"{b / a:.2f}" if a else "-")
            if key == "hit_rate":
                ratio = f"{b - a:+.3f}"
            head = f"{r['what']}, {r['split']}" if first else ""
            first = False
            print(f"| {head} | {label} | {a:.2f} | {b:.2f} | {ratio} |")
        lr = (r["real"].get("local_prefills"), r["real"].get("remote_prefills"))
        ls = (r["sim"].get("local_prefills"), r["sim"].get("remote_prefills"))
        if None not in lr and None not in ls:
            print(f"| | local / remote prefills | {lr[0]} / {lr[1]} | {ls[0]} / {ls[1]} | |")


if __name__ == "__main__":
    main()
