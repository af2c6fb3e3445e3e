"""The shared trace on real processes with and without the shared KV store (issue 59's gain):
`pdserve bench` replays the first --requests of ../shared/traces/mooncake_synthetic_trace.jsonl
(its arrival times, lengths and shared prefixes, lengths scaled by --length-scale so its blocks
are the engine's 16 tokens) against 1 prefill + 2 decode workers whose pools hold at most
--pool-fraction of the replayed requests' distinct blocks, once without tiers and once with every
worker on one Redis (`--kv-store`), same requests. Prompt tokens computed = prompt tokens x
(1 - the hit rate the responses' usage reports: pool hits and tier loads both count as cached).

The model is a random one of SmolLM-135M's shape (30 layers, hidden 576, 9 heads, 3 KV heads),
of TinyLlama-1.1B's (--shape tinyllama), of the demo model's (--shape tiny), or --model DIR. The trace shares prefixes mostly late
(the first 1,000 requests reuse 17% of their blocks, all 3,993 64%): the gain needs the whole.

Run: /usr/bin/python3 bench/kv_tier_trace.py --pdserve build/pdserve [--shape tiny|tinyllama] [--requests N]
(the SmolLM and TinyLlama shapes need more cores than 2: on 2 the trace's rate overloads them;
give them --threads 4 or more on a 16-core machine)
"""

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import cluster  # noqa: E402
TRACE = os.path.join(HERE, "..", "..", "shared", "traces", "mooncake_synthetic_trace.jsonl")


# make-model shapes (random bf16 weights, an 8k context).
SHAPES = {
    "smollm": ["--layers", "30", "--hidden", "576", "--heads", "9", "--kv-heads", "3", "--intermediate", "1536",
               "--vocab", "49152", "--tie-embeddings"],
    "tinyllama": ["--layers", "22", "--hidden", "2048", "--heads", "32", "--kv-heads", "4", "--intermediate", "5632",
                  "--vocab", "32000"],
    "tiny": ["--layers", "4", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--intermediate", "768",
             "--vocab", "4096"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--requests", type=int, default=3993)
    ap.add_argument("--length-scale", type=float, default=1 / 32)
    ap.add_argument("--time-scale", type=float, default=0.05)
    ap.add_argument("--pool-fraction", type=float, default=1 / 8)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm",
                    help="tiny: the demo model's shape (4 layers, hidden 256) with an 8k context; tinyllama: "
                         "TinyLlama-1.1B's (22 layers, hidden 2048, 32 heads, 4 KV heads)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kv_tier_trace_")
    redis = None
    try:
        model = a.model
        if not model:
            model = os.path.join(work, f"{a.shape}-shape")
            shape = SHAPES[a.shape]
            subprocess.run([a.pdserve, "make-model", model, "--arch", "llama", *shape, "--max-position", "8192",
                            "--dtype", "bf16", "--seed", "1"], check=True, capture_output=True)
        with open(a.trace) as f:
            rows = [json.loads(line) for _, line in zip(range(a.requests), f)]
        block = int(round(512 * a.length_scale))
        distinct = len({h for r in rows for h in r["hash_ids"]})
        longest = max(int(r["input_length"] * a.length_scale) + r["output_length"] for r in rows)
        kv_blocks = max(int(distinct * a.pool_fraction), longest // block + 2)
        redis = cluster.RedisServer(extra=("--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru"))
        results = {}
        for name, extra in (("no tiers", ""), ("redis store", f" --kv-store {redis.url}")):
            flags = f"--threads {a.threads} --block-size {block} --kv-blocks {kv_blocks}{extra}"
            out = subprocess.run([a.pdserve, "bench", "--compare-policies", "kv_aware", "--model", model,
                                  "--prefill", "1", "--decode", "2", "--worker-flags", flags,
                                  "--router-flags", f"--block-size {block}",
                                  "--workload", "trace", "--trace", a.trace,
                                  "--trace-length-scale", str(a.length_scale), "--trace-time-scale", str(a.time_scale),
                                  "--trace-max-requests", str(a.requests), "--format", "json"],
                                 capture_output=True, text=True)
            # `bench` exits 1 when a request failed, after printing its JSON (the failures counted
            # there, the first one's reason with them): reported in the table, not lost.
            try:
                results[name] = json.loads(out.stdout)[0]
            except ValueError:
                raise SystemExit(out.stderr[-3000:])
            print(f"{name}: {results[name]['failed']} failed{': ' + results[name].get('first_error', '') if results[name]['failed'] else ''}",
                  file=sys.stderr, flush=True)
        print(f"trace: first {a.requests} requests, lengths x{a.length_scale:g} ({block}-token blocks), "
              f"times x{a.time_scale:g}; {distinct} distinct blocks, pools of {kv_blocks} blocks "
              f"({kv_blocks / distinct:.2f} of them); 1 prefill + 2 decode workers, --threads {a.threads}")
        print("| run | prompt tokens | computed | hit rate | TTFT p50 | TTFT p90 | failed |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, r in results.items():
            computed = r["prompt_tokens"] * (1 - r["hit_rate"])
            print(f"| {name} | {r['prompt_tokens']} | {computed:.0f} | {r['hit_rate']:.3f} | "
                  f"{r['ttft_p50_ms']:.0f} ms | {r['ttft_p90_ms']:.0f} ms | {r['failed']} |")
        base, tier = results["no tiers"], results["redis store"]
        print(f"computed tokens: {(base['prompt_tokens'] * (1 - base['hit_rate'])) / max(1.0, tier['prompt_tokens'] * (1 - tier['hit_rate'])):.2f}x fewer; "
              f"TTFT p50 ratio {tier['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}")
    finally:
        if redis is not None:
            redis.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
