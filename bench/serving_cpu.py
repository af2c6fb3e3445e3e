#!/usr/bin/python3
"""Issue 62's measure: tokens a second and CPU per token through `pdserve serve` against the
engine alone, for each --threads given, on the 2-layer tiny model of bench/headline.py's serving
row (the engine is not the limit: 4 prompts a stream, 64 streams, 32 in, 256 out) or, with --shape
smollm, the SmolLM-135M shape of the engine's headline rows (bf16; 64 prompts, 32 streams, 32 in,
64 out: the engine is the limit); with --perf, also where each process's CPU goes (perf record
attached to serve, and to a router, a decode and a prefill worker as separate processes).

  /usr/bin/python3 bench/serving_cpu.py --threads 1,2 --rounds 2
  /usr/bin/python3 bench/serving_cpu.py --shape smollm --threads 1,2 --rounds 2
  /usr/bin/python3 bench/serving_cpu.py --perf       # writes perf data under --out
  # Two builds alternated (the order reversed every round): serve's CPU a token, old vs new.
  /usr/bin/python3 bench/serving_cpu.py --old /tmp/old/pdserve --threads 1,2 --rounds 3
  # Every path side by side: serve over gRPC and over the OpenAI API, and the tiers as separate
  # processes (router, decode, prefill: each one's CPU a token), at 64 and 256 streams.
  /usr/bin/python3 bench/serving_cpu.py --paths grpc,openai,tiers --streams 64,256 --threads 1
  # One build, router flags A against B, alternated (the order reversed every round), on each path:
  /usr/bin/python3 bench/serving_cpu.py --paths grpc,tiers --threads 1 --rounds 3 \
      --ab="--shared-decode-streams" --ab-names per-request,shared
  # Clients that take several tokens a message (serve's flags).
  /usr/bin/python3 bench/serving_cpu.py --paths grpc,openai --threads 1 --serve-args "--stream-interval 4"

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


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


LAST_ITL_P50_MS = [0.0]  # The last bench's inter-token latency, p50.
LAST_STEP_US = {}  # The last bench's engine step time a token, by process (pdserve bench --cpu-metrics).


def bench(pdserve, server, prompts, streams, http=None, cpu_metrics=""):
    out_len = SHAPE[3]
    endpoint = ["--endpoint", "openai-completions", "--http-server", http] if http else []
    cpu = ["--cpu-metrics", cpu_metrics] if cpu_metrics else []
    out = subprocess.run([pdserve, "bench", "--server", server.grpc, "--num-prompts", str(prompts),
                          "--max-concurrency", str(streams), "--input-len", "32", "--output-len", str(out_len),
                          *endpoint, *cpu, "--format", "json"], capture_output=True, text=True, check=True).stdout
    b = json.loads(out)
    b = b[0] if isinstance(b, list) else b
    LAST_ITL_P50_MS[0] = b["itl_p50_ms"]
    LAST_STEP_US.clear()
    LAST_STEP_US.update(b.get("engine_step_us_per_output_token", {}))
    return b["output_tokens_per_second"]


def engine(pdserve, model, threads, streams):
    out_len = SHAPE[3]
    out = subprocess.run([pdserve, "bench-engine", "--model", model, "--batch", str(streams), "--input-len", "32",
                          "--output-len", str(out_len), "--threads", threads, "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["decode_tok_s"]


def measured(pdserve, processes, server, perf_dir=None, tag="", streams=None, http=None):
    """Runs the bench once (after a short warm-up); returns tok/s and each process's CPU-s."""
    streams = streams or SHAPE[2]
    prompts = SHAPE[1] * streams // SHAPE[2]
    bench(pdserve, server, streams, streams, http)  # Warm-up: one prompt a stream.
    recorders = []
    if perf_dir:
        for name, p in processes:
            recorders.append(subprocess.Popen(
                ["perf", "record", "-F", "1999", "-g", "-o", os.path.join(perf_dir, f"{tag}{name}.data"),
                 "-p", str(p.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
    before = {name: cpu_seconds(p.proc.pid) for name, p in processes}
    # Each process's engine step time from its metrics (the CPU figure is the kernel's, from /proc).
    cpu_metrics = ",".join(f"{name}={p.addresses['metrics']}" for name, p in processes if "metrics" in p.addresses)
    tok_s = bench(pdserve, server, prompts, streams, http, cpu_metrics)
    cpu = {name: (cpu_seconds(p.proc.pid) - before[name]) / (prompts * SHAPE[3]) for name, p in processes}
    for r in recorders:
        r.send_signal(2)
        r.wait()
    return tok_s, cpu


EXTRA_SERVE_ARGS = []


def serve_args(model, threads, http=False):
    return ["serve", "--model", model, "--listen", "127.0.0.1:0", "--kv-memory-gib", "0.5", "--threads", threads,
            "--metrics-listen", "127.0.0.1:0",
            *(["--http-listen", "127.0.0.1:0"] if http else []), *EXTRA_SERVE_ARGS]


def run_serve(pdserve, model, threads, streams, http=False, extra=()):
    """serve's tok/s and CPU a token (us), over gRPC or the OpenAI API."""
    serve = cluster.Process(pdserve, serve_args(model, threads, http) + list(extra))
    try:
        tok_s, cpu = measured(pdserve, [("serve", serve)], serve, streams=streams,
                              http=serve.addresses["http"] if http else None)
    finally:
        serve.stop()
    return tok_s, cpu["serve"] * 1e6


def run_tiers(pdserve, model, threads, streams, router_args=()):
    """A router, a decode and a prefill worker as separate processes: tok/s and each one's CPU a token."""
    c = cluster.Cluster(pdserve, model, prefill=1, decode=1,
                        engine_args=("--kv-memory-gib", "0.5", "--threads", threads, "--metrics-listen", "127.0.0.1:0"),
                        router_args=("--metrics-listen", "127.0.0.1:0", *router_args))
    try:
        procs = [("router", c.router), ("decode", c.decode[0]), ("prefill", c.prefill[0])]
        tok_s, cpu = measured(pdserve, procs, c.router, streams=streams)
    finally:
        c.stop()
    return tok_s, {n: v * 1e6 for n, v in cpu.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--old", help="another pdserve binary: serve's figures of both, alternated")
    parser.add_argument("--threads", default="1,2", help="engine threads to compare, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--paths", help="grpc, openai, tiers: each path side by side (comma-separated)")
    parser.add_argument("--streams", help="concurrent streams, comma-separated (default: the shape's)")
    parser.add_argument("--serve-args", default="", help="more flags for serve, e.g. '--stream-interval 4'")
    parser.add_argument("--ab", help="router flags (serve's too) of variant B, compared with A (none) "
                        "on each of --paths, alternated")
    parser.add_argument("--ab-names", default="A,B", help="the two variants' names, comma-separated")
    parser.add_argument("--perf", action="store_true")
    parser.add_argument("--out", default="/tmp/serving_cpu", help="perf data directory")
    a = parser.parse_args()
    global SHAPE
    SHAPE = SHAPES[a.shape]
    EXTRA_SERVE_ARGS.extend(a.serve_args.split())
    pdserve = os.path.abspath(os.path.join(a.build, "pdserve"))
    streams_list = [int(x) for x in a.streams.split(",")] if a.streams else [SHAPE[2]]
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, a.shape)
        subprocess.run([pdserve, "make-model", model, "--arch", "llama", *SHAPE[0], "--seed", "1"],
                       check=True, capture_output=True)
        if a.perf:
            os.makedirs(a.out, exist_ok=True)
            threads = a.threads.split(",")[0]  # Of serve and the decode worker.
            serve = cluster.Process(pdserve, serve_args(model, threads))
            try:
                tok_s, cpu = measured(pdserve, [("serve", serve)], serve, a.out, "serve_")
            finally:
                serve.stop()
            print(f"serve: {tok_s:,.0f} tok/s, {cpu['serve'] * 1e6:.1f} us CPU/token")
            c = cluster.Cluster(pdserve, model, prefill=1, decode=1,
                                engine_args=("--kv-memory-gib", "0.5", "--threads", threads))
            try:
                procs = [("router", c.router), ("decode", c.decode[0]), ("prefill", c.prefill[0])]
                tok_s, cpu = measured(pdserve, procs, c.router, a.out, "tiers_")
            finally:
                c.stop()
            print(f"separate tiers: {tok_s:,.0f} tok/s; CPU/token: " +
                  ", ".join(f"{n} {cpu[n] * 1e6:.1f} us" for n, _ in procs))
            print(f"perf data in {a.out} (perf report -i FILE --no-children --sort dso|symbol|pid)")
            return
        if a.paths or a.ab is not None:
            # Each path; with --ab, variant A (no extra flags) and B side by side, the order
            # reversed every round.
            names = a.ab_names.split(",")
            variants = [(names[0], []), (names[1], a.ab.split())] if a.ab is not None else [("-", [])]
            paths = (a.paths or "grpc").split(",")
            print("| round | --threads | streams | engine alone tok/s | path | variant | tok/s | ratio | ITL p50 ms | CPU/token |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for r in range(a.rounds):
                for threads in a.threads.split(","):
                    for streams in streams_list:
                        e = engine(pdserve, model, threads, streams)
                        for path in paths:
                            for name, extra in (variants if r % 2 == 0 else variants[::-1]):
                                if path == "tiers":
                                    tok_s, cpu = run_tiers(pdserve, model, threads, streams, extra)
                                    figure = ", ".join(f"{n} {v:.1f} us" for n, v in cpu.items())
                                else:
                                    tok_s, cpu = run_serve(pdserve, model, threads, streams, path == "openai", extra)
                                    figure = f"serve {cpu:.1f} us"
                                steps = ", ".join(f"{n} {v:.1f}" for n, v in LAST_STEP_US.items())
                                figure += f" (engine steps: {steps} us)"
                                print(f"| {r} | {threads} | {streams} | {e:,.0f} | {path} | {name} | {tok_s:,.0f} | "
                                      f"{tok_s / e:.2f} | {LAST_ITL_P50_MS[0]:.2f} | {figure} |", flush=True)
            return
        builds = [("new", pdserve)] + ([("old", os.path.abspath(a.old))] if a.old else [])
        print("| round | --threads | engine alone tok/s | build | serve tok/s | ratio | serve CPU/token |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in range(a.rounds):
            for threads in a.threads.split(","):
                e = engine(pdserve, model, threads, SHAPE[2])
                for name, binary in (builds if r % 2 == 0 else builds[::-1]):
                    tok_s, cpu = run_serve(binary, model, threads, SHAPE[2])
                    print(f"| {r} | {threads} | {e:,.0f} | {name} | {tok_s:,.0f} | {tok_s / e:.2f} | {cpu:.0f} us |",
                          flush=True)


if __name__ == "__main__":
    main()
