"""bench/RESULTS.md's headline table, measured: each figure is a ratio against a limit measured in
the same run on the same machine (these machines are shared and noisy: an absolute time means
little), printed as the Markdown table RESULTS opens with, with the machine and date.

  decode, batch 1       bench-engine on a SmolLM-135M-shaped model (random bf16 weights): the
                        weights and KV read per step over the step time, against the machine's read
                        bandwidth (the faster of a plain and a prefetching read)
  decode, batch 16      tokens/s against batch 1 of the same run
  prefill, 512 tokens   achieved FLOP/s against the peak of the instruction the kernels used
  KV pages over tcp     bench-transport's transfer rate against memcpy and a plain loopback stream
  KV tier, host memory  loads (checksum checked, copied out as into a pool) against memcpy
  serving               tokens/s clients receive through `pdserve serve` (pdserve bench, 64
                        streams) against the engine alone (bench-engine, batch 64), a 2-layer model
                        whose steps cost little (issue 62's figure), and the serve process's CPU
                        time per output token

Run from the repository root after the build (about a minute on 2 cores):
  /usr/bin/python3 bench/headline.py [--build build]
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import cluster  # noqa: E402


def run_json(cmd):
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_rows(pdserve):
    base = [pdserve, "bench-engine", "--random-weights", "smollm-135m", "--format", "json", "--bw-gib", "1"]
    one = run_json(base + ["--batch", "1", "--input-len", "128", "--output-len", "64"])
    sixteen = run_json(base + ["--batch", "16", "--input-len", "128", "--output-len", "64"])
    prefill = run_json(base + ["--batch", "1", "--input-len", "512", "--output-len", "4"])
    cmd = "pdserve bench-engine --random-weights smollm-135m --batch {} --input-len {} --output-len {}"
    peak = prefill[f"{prefill['prefill_instruction']}_peak_gflops"]
    return [
        ("decode, batch 1, SmolLM-135M shape (bf16 weights)", f"{one['decode_tok_s']:.1f} tok/s",
         f"{one['decode_effective_gbs']:.1f} of {one['read_bw_gbs']:.1f} GB/s read bandwidth",
         f"{one['decode_bw_ratio']:.2f}", cmd.format(1, 128, 64)),
        ("decode, batch 16, same model", f"{sixteen['decode_tok_s']:.1f} tok/s", "batch 1 of the same run",
         f"{sixteen['decode_tok_s'] / one['decode_tok_s']:.1f}x", cmd.format(16, 128, 64)),
        ("prefill, 512 tokens, same model", f"{prefill['prefill_tok_s']:.0f} tok/s",
         f"{prefill['prefill_gflops']:.0f} of {peak:.0f} GFLOP/s ({prefill['prefill_instruction']} peak)",
         f"{prefill['prefill_peak_ratio']:.2f}", cmd.format(1, 512, 4)),
    ]


def transport_row(pdserve):
    t = run_json([pdserve, "bench-transport", "--transport", "tcp", "--format", "json"])
    # Both references: memcpy (what a copy costs at all) and a plain loopback TCP stream (1 MiB
    # sends, default socket buffers; the transport's own buffers can beat it).
    return [("KV pages over tcp (256 MiB of 24 KiB pages)", f"{t['kv_gb_s']:.2f} GB/s",
             f"memcpy {t['memcpy_gb_s']:.1f} GB/s; a plain loopback TCP stream {t['socket_gb_s']:.2f} GB/s",
             f"{t['kv_memcpy_ratio']:.2f} of memcpy; {t['kv_socket_ratio']:.2f}x the stream",
             "pdserve bench-transport --transport tcp")]


def tier_row(bench):
    if not os.path.exists(bench):
        return [("KV tier, host memory", "not built", f"({bench} missing: ninja -C build kv_tier_io_bench)", "", "")]
    redis = cluster.RedisServer()
    try:
        with tempfile.TemporaryDirectory() as work:
            t = run_json([bench, "--dir", os.path.join(work, "tier"), "--redis", redis.url,
                          "--block-bytes", str(512 * 1024), "--blocks", "256", "--run", "64"])
    finally:
        redis.kill()
    return [("KV tier, host memory: loads of 512 KiB blocks (checked, copied out)", f"{t['host_mbps']:,.0f} MB/s",
             f"memcpy {t['memcpy_mbps']:,.0f} MB/s", f"{t['host_mbps'] / t['memcpy_mbps']:.2f}",
             "build/bench/kv_tier_io_bench (bench/kv_tier_io.py has the disk and Redis rows)")]


def serving_rows(pdserve):
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "tiny")
        subprocess.run([pdserve, "make-model", model, "--arch", "llama", "--layers", "2", "--hidden", "64",
                        "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--seed", "1"],
                       check=True, capture_output=True)
        engine = run_json([pdserve, "bench-engine", "--model", model, "--batch", "64", "--input-len", "32",
                           "--output-len", "256", "--format", "json"])
        serve = cluster.Process(pdserve, ["serve", "--model", model, "--listen", "127.0.0.1:0",
                                          "--kv-memory-gib", "0.25"])
        try:
            before = cpu_seconds(serve.proc.pid)
            start = time.time()
            b = run_json([pdserve, "bench", "--server", serve.grpc, "--num-prompts", "256",
                          "--max-concurrency", "64", "--input-len", "32", "--output-len", "256", "--format", "json"])
            cpu = cpu_seconds(serve.proc.pid) - before
            wall = time.time() - start
        finally:
            serve.stop()
    tokens = 256 * 256
    served = (b[0] if isinstance(b, list) else b)["output_tokens_per_second"]
    return [("serving: tok/s clients receive through `serve`, 64 streams, 2-layer model",
             f"{served:,.0f} tok/s", f"the engine alone {engine['decode_tok_s']:,.0f} tok/s (batch 64)",
             f"{served / engine['decode_tok_s']:.2f}",
             "pdserve bench --num-prompts 256 --max-concurrency 64 --input-len 32 --output-len 256"),
            ("serving: the serve process's CPU per output token", f"{cpu / tokens * 1e6:.0f} us",
             f"{cpu:.1f} CPU-s over {wall:.1f} s for {tokens:,} tokens", "", "(the same run)")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    pdserve = os.path.abspath(os.path.join(a.build, "pdserve"))
    rows = engine_rows(pdserve) + transport_row(pdserve)
    rows += tier_row(os.path.abspath(os.path.join(a.build, "bench", "kv_tier_io_bench")))
    rows += serving_rows(pdserve)
    today = datetime.date.today().isoformat()
    machine = f"{cpu_model()}, {os.cpu_count()} cores"
    print(f"Measured {today} on {machine} by `/usr/bin/python3 bench/headline.py`.\n")
    print("| figure | value | limit in the same run | ratio | command |")
    print("| --- | --- | --- | --- | --- |")
    for figure, value, limit, ratio, cmd in rows:
        print(f"| {figure} | {value} | {limit} | {ratio} | `{cmd}` |" if cmd else
              f"| {figure} | {value} | {limit} | {ratio} | |")


if __name__ == "__main__":
    main()
