#!/usr/bin/python3
"""Issue 62's measure: tokens a second and CPU per token through `pdserve serve` against the
engine alone, for each --threads given, on the 2-layer tiny model of bench/headline.py's serving
row (the engine is not the limit: 256 prompts, 64 streams, 32 in, 256 out) or, with --shape
smollm, the SmolLM-135M shape of the engine's headline rows (bf16; 64 prompts, 32 streams, 32 in,
64 out: the engine is the limit); with --perf, also where each process's CPU goes (perf record
attached to serve, and to a router, a decode and a prefill worker as separate processes).

  /usr/bin/python3 bench/serving_cpu.py --threads 1,2 --rounds 2
  /usr/bin/python3 bench/serving_cpu.py --shape smollm --threads 1,2 --rounds 2
  /usr/bin/python3 bench/serving_cpu.py --perf       # writes perf data under --out

bench/notes/serving-cpu.md has its figures.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import cluster  # noqa: E402

# The model (make-model's arguments) and the load: prompts, streams, output tokens each.
SHAPES = {
    "tiny": (["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "512"],
             256, 64, 256),
    "smollm": (["--layers", "30", "--hidden", "576", "--heads", "9", "--kv-heads", "3", "--intermediate",
                "1536", "--vocab", "49152", "--dtype", "bf16"], 64, 32, 64),
}
SHAPE = SHAPES["tiny"]


def tokens():
    return SHAPE[1] * SHAPE[3]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(pdserve, address, prompts=None):
    _, n, streams, out_len = SHAPE
    out = subprocess.run([pdserve, "bench", "--server", address, "--num-prompts", str(prompts or n),
                          "--max-concurrency", str(streams), "--input-len", "32", "--output-len", str(out_len),
                          "--format", "json"], capture_output=True, text=True, check=True).stdout
    b = json.loads(out)
    return (b[0] if isinstance(b, list) else b)["output_tokens_per_second"]


def engine(pdserve, model, threads):
    _, _, streams, out_len = SHAPE
    out = subprocess.run([pdserve, "bench-engine", "--model", model, "--batch", str(streams), "--input-len", "32",
                          "--output-len", str(out_len), "--threads", threads, "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["decode_tok_s"]


def measured(pdserve, processes, address, perf_dir=None, tag=""):
    """Runs the bench once (after a short warm-up); returns tok/s and each process's CPU-s."""
    bench(pdserve, address, prompts=SHAPE[2])  # Warm-up: one prompt a stream.
    recorders = []
    if perf_dir:
        for name, p in processes:
            recorders.append(subprocess.Popen(
                ["perf", "record", "-F", "1999", "-g", "-o", os.path.join(perf_dir, f"{tag}{name}.data"),
                 "-p", str(p.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
    before = {name: cpu_seconds(p.proc.pid) for name, p in processes}
    tok_s = bench(pdserve, address)
    cpu = {name: cpu_seconds(p.proc.pid) - before[name] for name, p in processes}
    for r in recorders:
        r.send_signal(2)
        r.wait()
    return tok_s, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--threads", default="1,2", help="engine threads to compare, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--perf", action="store_true")
    parser.add_argument("--out", default="/tmp/serving_cpu", help="perf data directory")
    a = parser.parse_args()
    global SHAPE
    SHAPE = SHAPES[a.shape]
    pdserve = os.path.abspath(os.path.join(a.build, "pdserve"))
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, a.shape)
        subprocess.run([pdserve, "make-model", model, "--arch", "llama", *SHAPE[0], "--seed", "1"],
                       check=True, capture_output=True)
        if a.perf:
            os.makedirs(a.out, exist_ok=True)
            serve = cluster.Process(pdserve, ["serve", "--model", model, "--listen", "127.0.0.1:0",
                                              "--kv-memory-gib", "0.5"])
            try:
                tok_s, cpu = measured(pdserve, [("serve", serve)], serve.grpc, a.out, "serve_")
            finally:
                serve.stop()
            print(f"serve: {tok_s:,.0f} tok/s, {cpu['serve'] / tokens() * 1e6:.1f} us CPU/token")
            c = cluster.Cluster(pdserve, model, prefill=1, decode=1, engine_args=("--kv-memory-gib", "0.5"))
            try:
                procs = [("router", c.router), ("decode", c.decode[0]), ("prefill", c.prefill[0])]
                tok_s, cpu = measured(pdserve, procs, c.router.grpc, a.out, "tiers_")
            finally:
                c.stop()
            print(f"separate tiers: {tok_s:,.0f} tok/s; CPU/token: " +
                  ", ".join(f"{n} {cpu[n] / tokens() * 1e6:.1f} us" for n, _ in procs))
            print(f"perf data in {a.out} (perf report -i FILE --no-children --sort dso|symbol|pid)")
            return
        print("| round | --threads | engine alone tok/s | serve tok/s | ratio | serve CPU/token |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in range(a.rounds):
            for threads in a.threads.split(","):
                e = engine(pdserve, model, threads)
                serve = cluster.Process(pdserve, ["serve", "--model", model, "--listen", "127.0.0.1:0",
                                                  "--kv-memory-gib", "0.5", "--threads", threads])
                try:
                    tok_s, cpu = measured(pdserve, [("serve", serve)], serve.grpc)
                finally:
                    serve.stop()
                print(f"| {r} | {threads} | {e:,.0f} | {tok_s:,.0f} | {tok_s / e:.2f} | "
                      f"{cpu['serve'] / tokens() * 1e6:.0f} us |", flush=True)


if __name__ == "__main__":
    main()
