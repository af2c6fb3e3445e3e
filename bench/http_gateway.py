#!/usr/bin/python3
"""The OpenAI HTTP API's cost and concurrency, old build against new, with gRPC as the baseline.

For each round and each binary: one `pdserve serve` (demo model), then the serving benchmark
through the gRPC endpoint and through the HTTP API at each concurrency. Binaries alternate within a
round so that both see the same machine. Prints one row per (round, binary, endpoint, concurrency).

  bench/http_gateway.py --old /tmp/old/build/pdserve --new build/pdserve --rounds 3 \\
      --concurrency 4,128 --model models/pdserve-demo
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import cluster  # noqa: E402


def bench(pdserve, s, endpoint, concurrency, prompts, seed):
    out = subprocess.run([pdserve, "bench", "--server", s.grpc, "--http-server", s.addresses["http"],
                          "--endpoint", endpoint, "--num-prompts", str(prompts), "--input-len", "128",
                          "--output-len", "32", "--max-concurrency", str(concurrency), "--seed", str(seed),
                          "--format", "json"], capture_output=True, text=True, timeout=900)
    try:  # Failed requests make bench exit 1; they are part of the result (ok/sent).
        return json.loads(out.stdout)[-1]
    except (json.JSONDecodeError, IndexError):
        raise SystemExit(f"bench failed: {out.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--model", default="models/pdserve-demo")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="4,128")
    ap.add_argument("--prompts-per-stream", type=int, default=4)
    args = ap.parse_args()
    seed = 1
    print("| round | build | endpoint | concurrency | ok/sent | TTFT mean / p99 ms | TPOT mean ms | output tok/s | first error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in range(1, args.rounds + 1):
        for name, binary in (("old", args.old), ("new", args.new)):
            s = cluster.Process(binary, ["serve", "--model", args.model, "--listen", "127.0.0.1:0",
                                         "--http-listen", "127.0.0.1:0", "--threads", "2", "--kv-memory-gib", "1",
                                         "--max-num-seqs", "256", "--max-waiting", "1024"])
            try:
                for c in (int(x) for x in args.concurrency.split(",")):
                    prompts = max(64, c * args.prompts_per_stream)
                    for endpoint in ("grpc", "openai-completions"):
                        seed += 1  # A fresh seed per run: no prefix-cache hits between runs.
                        m = bench(binary, s, endpoint, c, prompts, seed)
                        print(f"| {r} | {name} | {endpoint} | {c} | {m['ok']}/{prompts} | "
                              f"{m['ttft_mean_ms']:.1f} / {m['ttft_p99_ms']:.1f} | {m['tpot_mean_ms']:.3f} | "
                              f"{m['output_tokens_per_second']:,.0f} | {m.get('first_error', '')} |", flush=True)
            finally:
                s.stop()


if __name__ == "__main__":
    main()
