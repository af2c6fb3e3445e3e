#!/usr/bin/python3
"""LoRA affinity against round robin (issue 61): two decode workers that hold at most
--max-cpu-loras of 8 rank-16 adapters each, one random sequence of requests over the adapters sent
through a router with each policy (fresh workers per run, the policies alternated round by round),
and per policy: adapters read from disk (the workers' lora_loads), request latency and
throughput. The model is a random one of SmolLM-135M's shape (bf16 weights), the adapters random
in PEFT's layout (tests/reference/peft_adapter.py), so a load costs what a real one would.

  /usr/bin/python3 bench/lora_affinity.py --pdserve build/pdserve --rounds 2

bench/notes/lora-cpu.md has the figures.
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
import cluster  # noqa: E402
from peft_adapter import write_lora  # noqa: E402

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402

SMOLLM = ["--arch", "llama", "--layers", "30", "--hidden", "576", "--heads", "9", "--kv-heads", "3",
          "--intermediate", "1536", "--vocab", "49152", "--dtype", "bf16"]


def run_policy(pdserve, model, modules, policy, sequence, args):
    workers = [cluster.Process(pdserve, ["decode", "--listen", "127.0.0.1:0", "--model", model, "--threads", "1",
                                         "--kv-memory-gib", "0.25", "--lora-modules", modules,
                                         "--max-cpu-loras", str(args.max_cpu_loras)], timeout=300)
               for _ in range(2)]
    router = cluster.Process(pdserve, ["router", "--listen", "127.0.0.1:0", "--model", model,
                                       "--decode", ",".join(w.grpc for w in workers), "--policy", policy])
    try:
        start = [cluster.worker_info(w.grpc, False).lora_loads for w in workers]
        stub = pbg.GenerationStub(grpc.insecure_channel(router.grpc))
        latencies, lock, next_index = [], threading.Lock(), [0]

        def client():
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= len(sequence):
                    return
                ids = [1000 + i] + list(range(2000, 2000 + args.prompt_len - 1))
                sp = pb.SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True,
                                       lora_name=sequence[i])
                t = time.perf_counter()
                for _ in stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sp), timeout=600):
                    pass
                with lock:
                    latencies.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        loads = sum(cluster.worker_info(w.grpc, False).lora_loads - s for w, s in zip(workers, start))
    finally:
        for p in [router] + workers:
            p.stop()
    latencies.sort()
    return {"loads": loads, "p50": statistics.median(latencies),
            "p90": latencies[int(0.9 * (len(latencies) - 1))],
            "tok_s": len(sequence) * args.max_tokens / wall}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pdserve", default="build/pdserve")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--max-cpu-loras", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    a = p.parse_args()
    pdserve = os.path.abspath(a.pdserve)
    work = tempfile.mkdtemp(prefix="pdserve_lora_affinity_")
    try:
        model = os.path.join(work, "model")
        subprocess.run([pdserve, "make-model", model, *SMOLLM], check=True, capture_output=True)
        names = [f"a{i}" for i in range(a.adapters)]
        for i, n in enumerate(names):
            write_lora(os.path.join(work, n), model, rank=16, alpha=32, seed=i + 1, b_std=0.01)
        modules = ",".join(f"{n}={os.path.join(work, n)}" for n in names)
        rng = random.Random(11)
        sequence = [rng.choice(names) for _ in range(a.requests)]
        results = {"round_robin": [], "kv_aware": []}
        for r in range(a.rounds):
            order = ["round_robin", "kv_aware"] if r % 2 == 0 else ["kv_aware", "round_robin"]
            for policy in order:
                res = run_policy(pdserve, model, modules, policy, sequence, a)
                results[policy].append(res)
                print(f"round {r} {policy}: {res['loads']} loads, p50 {res['p50'] * 1000:.0f} ms, "
                      f"p90 {res['p90'] * 1000:.0f} ms, {res['tok_s']:.1f} tok/s", flush=True)
        print(f"\n{a.requests} requests over {a.adapters} adapters (rank 16, SmolLM-135M shape), 2 decode workers "
              f"with --max-cpu-loras {a.max_cpu_loras}, concurrency {a.concurrency}, {a.prompt_len} in / "
              f"{a.max_tokens} out; medians over {a.rounds} rounds:")
        print("| policy | adapter loads | p50 latency | p90 latency | tok/s |")
        print("| --- | --- | --- | --- | --- |")
        for policy, rs in results.items():
            med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
            print(f"| {policy} | {med('loads'):.0f} | {med('p50') * 1000:.0f} ms | {med('p90') * 1000:.0f} ms | "
                  f"{med('tok_s'):.1f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
