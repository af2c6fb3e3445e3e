#!/usr/bin/python3
"""Issue 61's speed figures for LoRA on the CPU: the engine's decode step and prefill with
adapters against the base model, the configurations alternated round by round in one run
(bench-engine --lora-adapters: request i runs adapter i mod N, rank --rank, all seven projections,
bf16 compute where the CPU has it), and an adapter's load from disk.

  /usr/bin/python3 bench/lora_cpu.py --pdserve build/pdserve --shape smollm-135m --rounds 5
  /usr/bin/python3 bench/lora_cpu.py --pdserve build/pdserve --shape bench/shapes/llama3.2-1b.json --rounds 3

Decode: batch 16, 32 in, 32 out, the median step; configurations: base, 8 adapters (2 requests
each), 1 adapter (all 16). Prefill: one 512-token prompt, the fastest of 3 rounds, base against 1
adapter. Each figure is the median over rounds of the ratio to the same round's base.
bench/notes/lora-cpu.md has the figures.
"""
import argparse
import json
import statistics
import subprocess


def run(pdserve, shape, threads, *args):
    out = subprocess.run([pdserve, "bench-engine", "--random-weights", shape, "--threads", str(threads),
                          "--format", "json", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pdserve", default="build/pdserve")
    p.add_argument("--shape", default="smollm-135m")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    decode = {"base": [], "8 adapters": [], "1 adapter": []}
    prefill = {"base": [], "1 adapter": []}
    loads, cpu, dtype = [], "", ""
    for r in range(a.rounds):
        order = [("base", 0), ("8 adapters", 8), ("1 adapter", 1)]
        if r % 2:
            order.reverse()
        for name, n in order:
            j = run(a.pdserve, a.shape, a.threads, "--batch", "16", "--input-len", "32", "--output-len", "32",
                    "--prefill-rounds", "1", "--lora-adapters", str(n), "--lora-rank", str(a.rank))
            decode[name].append(j["decode_step_ms_median"])
            if n:
                loads.append(j["lora_load_ms"])
            cpu, dtype = j["cpu"], j["compute_dtype"]
        for name, n in (("base", 0), ("1 adapter", 1))[::(-1 if r % 2 else 1)]:
            j = run(a.pdserve, a.shape, a.threads, "--batch", "1", "--input-len", "512", "--output-len", "2",
                    "--prefill-rounds", "3", "--lora-adapters", str(n), "--lora-rank", str(a.rank))
            prefill[name].append(j["prefill_tok_s"])
    print(f"{a.shape}, rank {a.rank}, {dtype} compute, {cpu}, {a.rounds} rounds")
    for name, steps in decode.items():
        ratios = [s / b for s, b in zip(steps, decode["base"])]
        print(f"decode batch 16, {name:10s}: median step {statistics.median(steps):8.2f} ms "
              f"(range {min(steps):.2f}-{max(steps):.2f}); x base: median {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f})")
    ratios = [b / s for s, b in zip(prefill["1 adapter"], prefill["base"])]
    print(f"prefill 512, 1 adapter: {statistics.median(prefill['1 adapter']):.0f} tok/s against "
          f"{statistics.median(prefill['base']):.0f}; time x base: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"adapter load from disk: median {statistics.median(loads):.1f} ms (range {min(loads):.1f}-{max(loads):.1f})")


if __name__ == "__main__":
    main()
