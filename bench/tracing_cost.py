#!/usr/bin/python3
"""What tracing costs a served request: `pdserve serve` with every request traced
(--otlp-traces-endpoint to a collector in this script that takes every span, --trace-sample-ratio
1) against tracing off, side by side: rounds interleaved (off then on, on then off, ...), each run a
fresh server, a warm-up, then `pdserve bench` against it; the ratios of the best rounds and of
the median rounds (the machine is shared and noisy: at --request-rate inf a run's TTFT is mostly
its queueing, which moves by 20% between runs of the same binary).

  /usr/bin/python3 bench/tracing_cost.py --pdserve build/pdserve [--model DIR] [--rounds 3]

Default model: a random 4-layer, 256-wide llama (make-model; --layers, --hidden), small so that
a decode step is short and tracing's share of it is as large as it gets. Prints output tok/s and TTFT p50 of
each, the ratios (on / off) and the spans the collector took.
"""
import argparse
import http.server
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading


class Sink:
    """An OTLP/HTTP collector that takes every batch and counts the bytes."""

    def __init__(self):
        self.bytes = 0
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                sink.bytes += len(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"


def run_round(pdserve, model, tracing, sink, args):
    cmd = [pdserve, "serve", "--model", model, "--listen", "127.0.0.1:0", "--threads", str(args.threads),
           "--metrics-listen", "127.0.0.1:0"]
    if tracing:
        cmd += ["--otlp-traces-endpoint", sink.url, "--trace-sample-ratio", "1"]
    env = dict(os.environ, PDSERVE_LOG_LEVEL="warning")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stdout.readline()
        addresses = dict(re.findall(r"(\w+)=(\S+)", line))
        bench = [pdserve, "bench", "--server", addresses["grpc"], "--input-len", str(args.input_len),
                 "--output-len", str(args.output_len), "--format", "json", "--request-rate", args.request_rate]
        subprocess.run(bench + ["--num-prompts", "8", "--seed", "99"], check=True, capture_output=True)
        out = subprocess.run(bench + ["--num-prompts", str(args.num_prompts)], check=True,
                             capture_output=True, text=True).stdout
        r = json.loads(out)[0]
        # The server's CPU time for the whole run (warm-up included): less noisy than latency.
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        spans = None
        if tracing:
            import urllib.request
            with urllib.request.urlopen(f"http://{addresses['metrics']}/metrics", timeout=10) as m:
                text = m.read().decode()
            found = re.findall(r"^pdserve_trace_spans_(exported|dropped)_total\{[^}]*\} (\S+)$", text, re.M)
            spans = {k: float(v) for k, v in found}
        return r["output_tokens_per_second"], r["ttft_p50_ms"], cpu, spans
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pdserve", required=True)
    p.add_argument("--model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--request-rate", default="inf",
                   help="requests per second (inf: all at once, TTFT is then mostly queueing)")
    p.add_argument("--layers", type=int, default=4, help="the random model's (without --model)")
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args()
    pdserve = os.path.abspath(args.pdserve)
    model = args.model
    tmp = tempfile.mkdtemp(prefix="tracing_cost_")
    if model is None:
        model = os.path.join(tmp, "model")
        subprocess.run([pdserve, "make-model", model, "--arch", "llama", "--layers", str(args.layers),
                        "--hidden", str(args.hidden), "--heads", "8", "--kv-heads", "2", "--vocab", "4096",
                        "--seed", "1"], check=True, capture_output=True)
    sink = Sink()
    best = {False: (0.0, float("inf")), True: (0.0, float("inf"))}
    runs = {False: [], True: []}
    last_spans = None
    for rnd in range(args.rounds):
        # The order alternates (off first, then on first): a run's position must not favour it.
        for tracing in ((False, True) if rnd % 2 == 0 else (True, False)):
            tok_s, ttft, cpu, spans = run_round(pdserve, model, tracing, sink, args)
            print(f"round {rnd + 1} tracing {'on ' if tracing else 'off'}: {tok_s:.1f} output tok/s, "
                  f"TTFT p50 {ttft:.2f} ms, server CPU {cpu:.2f} s" + (f", spans {spans}" if spans else ""),
                  flush=True)
            best[tracing] = (max(best[tracing][0], tok_s), min(best[tracing][1], ttft))
            runs[tracing].append((tok_s, ttft, cpu))
            if spans:
                last_spans = spans
    off, on = best[False], best[True]
    print(f"best: off {off[0]:.1f} tok/s, TTFT p50 {off[1]:.2f} ms; on {on[0]:.1f} tok/s, "
          f"TTFT p50 {on[1]:.2f} ms")
    print(f"on / off, best rounds: output tok/s {on[0] / off[0]:.3f}, TTFT p50 {on[1] / off[1]:.3f}")
    med = {t: [statistics.median(r[i] for r in runs[t]) for i in range(3)] for t in runs}
    print(f"on / off, median rounds: output tok/s {med[True][0] / med[False][0]:.3f}, "
          f"TTFT p50 {med[True][1] / med[False][1]:.3f}, server CPU seconds {med[True][2] / med[False][2]:.3f}")
    print(f"collector took {sink.bytes} bytes; last round's spans {last_spans}")


if __name__ == "__main__":
    sys.exit(main())
