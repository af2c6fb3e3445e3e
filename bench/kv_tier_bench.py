"""What a KV tier saves: the time to first token of prompts whose prefixes a fresh `serve` (an
empty pool, as after a restart or on another worker) computes, against the same prompts when it
loads those prefixes from the disk tier or the shared Redis store, in one run on one machine.

Each prompt is a distinct prefix of --prefix-len tokens and a short suffix; the first server
computes them all (and stores them in the tier); a second server, fresh, then answers the same
prefixes with other suffixes, loading them. TTFT is measured at the client (gRPC stream, one
output token). The model is a random one of the given shape (`make-model`: the KV bits and the
compute do not depend on the weights' values), or --model DIR.

Run: /usr/bin/python3 bench/kv_tier_bench.py --pdserve build/pdserve [--layers 16 --hidden 1024]
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import cluster  # noqa: E402

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402


def ttfts(process, prompts):
    stub = pbg.GenerationStub(grpc.insecure_channel(process.grpc))
    out = []
    for ids in prompts:
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids),
                                 sampling=pb.SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        start = time.perf_counter()
        for _ in stub.Generate(req, timeout=600):
            out.append(time.perf_counter() - start)
            break
    return out


def settle(process, tier):
    last, deadline = -1, time.time() + 120
    while time.time() < deadline:
        now = sum(cluster.metric(process, "pdserve_kv_offload_store_bytes_total", role=r, tier=tier)
                  for r in ("prefill", "decode"))
        if now == last and now > 0:
            return now
        last = now
        time.sleep(0.5)
    raise SystemExit(f"{tier}: stores did not settle")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--threads", default="2")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kv_tier_bench_")
    redis = None
    try:
        model = a.model
        if not model:
            model = os.path.join(work, "model")
            subprocess.run([a.pdserve, "make-model", model, "--arch", "llama", "--layers", str(a.layers),
                            "--hidden", str(a.hidden), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
                            "--intermediate", str(a.hidden * 3), "--vocab", "4096", "--seed", "1"],
                           check=True, capture_output=True)
        redis = cluster.RedisServer(extra=("--maxmemory", "8gb", "--maxmemory-policy", "allkeys-lru"))
        rng = random.Random(5)
        prefixes = [[rng.randrange(3, 4000) for _ in range(a.prefix_len)] for _ in range(a.prompts)]
        first = [p + [rng.randrange(3, 4000) for _ in range(3)] for p in prefixes]
        again = [p + [rng.randrange(3, 4000) for _ in range(3)] for p in prefixes]
        tiers = {"disk": ["--kv-offload-disk", os.path.join(work, "disk"), "--kv-offload-disk-gib", "16"],
                 "redis": ["--kv-store", redis.url]}
        rows = []
        for name, flags in tiers.items():
            def serve():
                return cluster.Process(a.pdserve, ["serve", "--model", model, "--listen", "127.0.0.1:0",
                                                   "--threads", a.threads, "--metrics-listen", "127.0.0.1:0",
                                                   *flags])
            p = serve()
            try:
                computed = ttfts(p, first)
                stored = settle(p, name)
            finally:
                p.stop()
            q = serve()
            try:
                loaded = ttfts(q, again)
                tokens = sum(cluster.metric(q, "pdserve_kv_offload_loaded_tokens_total", role=r)
                             for r in ("prefill", "decode"))
                io = sum(cluster.metric(q, "pdserve_kv_offload_load_seconds_total", role=r, tier=name)
                         for r in ("prefill", "decode"))
            finally:
                q.stop()
            rows.append((name, statistics.median(computed), statistics.median(loaded), stored, tokens, io / len(again)))
        print(f"model: {model if a.model else f'random llama, {a.layers} layers, hidden {a.hidden}, {a.kv_heads} kv heads'}; "
              f"{a.prompts} prompts of {a.prefix_len}+3 tokens; --threads {a.threads}")
        print("| tier | TTFT computing (median) | TTFT loading the prefix | ratio | bytes stored | tokens loaded | "
              "I/O thread's load time per prompt |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, c, l, stored, tokens, io in rows:
            print(f"| {name} | {c * 1000:.1f} ms | {l * 1000:.1f} ms | {c / l:.1f}x | {stored / 2**20:.1f} MiB | "
                  f"{tokens:.0f} | {io * 1000:.1f} ms |")
    finally:
        if redis is not None:
            redis.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
