#!/usr/bin/python3
"""Speculative decoding against plain decoding, side by side in one run (bench-engine, methods
interleaved round by round, the best round of each kept), on three workloads:

  quote   a model whose greedy output quotes its prompt: SmolLM-135M's shape and byte count, its
          weights real but built so that token a is always followed by succ(a) (a random cycle
          over 576 token ids: one-hot embeddings, every projection zero but read, lm_head row
          succ(a) = 8 e_a); each prompt walks the cycle for 240 tokens, then starts it again, so
          the answer is the prompt's own text (the best case: code edits, rewrites that keep
          most of the text);
  random  SmolLM-135M's shape with random weights, greedy, on random prompts (outputs repeat
          only where the model falls into loops);
  sampled the same at temperature 1 (no repetition: the cost of drafting that is rejected);

and the trained demo model (models/pdserve-demo), greedy, on random prompts (`demo`) and on
`demo-quote`: passages of its held-out text (heldout.txt, never trained on), each followed by its
own first 24 tokens again, so that a model that learned to copy continues by quoting the passage
(the demo model's rewrite-with-small-edits case: its answer repeats its prompt, as far as it
copies).

  /usr/bin/python3 bench/speculative.py --pdserve build/pdserve [--rounds 3] [--batches 1,16]
      [--requests-per-slot 4]

Prints a Markdown table: decode tok/s per method, the ratio to plain, acceptance rate and mean
acceptance length.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np

HIDDEN = 576
CYCLE = 576


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def make_quote_model(pdserve, out):
    """SmolLM-135M's shape (bf16), every weight zero but the embeddings, norms and lm_head."""
    if os.path.exists(os.path.join(out, "config.json")):
        return
    subprocess.run([pdserve, "make-model", out, "--arch", "llama", "--layers", "30", "--hidden", str(HIDDEN),
                    "--heads", "9", "--kv-heads", "3", "--intermediate", "1536", "--vocab", "49152",
                    "--dtype", "bf16", "--seed", "1"], check=True, capture_output=True)
    rng = random.Random(7)
    order = list(range(3, 3 + CYCLE))
    rng.shuffle(order)
    succ = {a: order[(i + 1) % CYCLE] for i, a in enumerate(order)}
    # Token a embeds as the one-hot e_(a-3); after it, lm_head's row succ(a) scores 8 sqrt(hidden)
    # (the final norm scales the one-hot by sqrt(hidden)), every other row 0.
    path = os.path.join(out, "model.safetensors")
    header, _ = read_header(path)
    embed = np.zeros((49152, HIDDEN), np.float32)
    lm_head = np.zeros((49152, HIDDEN), np.float32)
    for a in order:
        embed[a, a - 3] = 1.0
        lm_head[succ[a], a - 3] = 8.0
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        shape = tuple(meta["shape"])
        if name == "model.embed_tokens.weight":
            tensors[name] = embed
        elif name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, np.float32)
        else:
            tensors[name] = np.zeros(shape, np.float32)
    tensors["lm_head.weight"] = lm_head
    write_bf16_safetensors(path, tensors)
    with open(os.path.join(out, "chain.json"), "w") as f:
        json.dump({"order": order}, f)


def write_bf16_safetensors(path, tensors):
    header, offset = {}, 0
    blobs = []
    for name, a in tensors.items():
        bits = (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype("<u2")  # Exact: 0, 1, 8.
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
        blobs.append(bits)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for b in blobs:
            f.write(b.tobytes())


def quote_prompts(model, count, length=256, restart=16):
    """Prompts that walk the cycle for length - restart tokens, then start the walk again."""
    with open(os.path.join(model, "chain.json")) as f:
        order = json.load(f)["order"]
    lines = []
    for i in range(count):
        start = (37 * i) % CYCLE
        walk = [order[(start + j) % CYCLE] for j in range(length - restart)]
        lines.append(",".join(map(str, walk + walk[:restart])))
    return lines


def demo_quote_prompts(pdserve, model, count, length=150, restart=24):
    """Held-out passages of ~700 characters, cut to `length` tokens, then their first `restart`
    tokens again (every prompt the same length, as bench-engine wants)."""
    passages, cur = [], ""
    with open(os.path.join(model, "heldout.txt")) as f:
        for line in f.read().split("\n"):
            if len(line) < 8:  # Chapter marks (Ge40).
                continue
            cur += line + "\n"
            if len(cur) > 700:
                passages.append(cur)
                cur = ""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
        for p in passages:
            f.write(json.dumps({"text": p}) + "\n")
        f.flush()
        out = subprocess.run([pdserve, "tokenize", "--tokenizer", model, "--input-jsonl", f.name],
                             capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line)["token_ids"] for line in out.splitlines()]
    rows = [r[:length] for r in rows if len(r) >= length][:count]
    if len(rows) < count:
        sys.exit(f"demo-quote: {len(rows)} held-out passages of {length} tokens, {count} wanted")
    return [",".join(map(str, r + r[:restart])) for r in rows]


def bench(pdserve, args):
    out = subprocess.run([pdserve, "bench-engine", *args, "--format", "json", "--bw-gib", "0.5",
                          "--prefill-rounds", "1", "--sgemm-n", "256"],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"bench-engine {' '.join(args)}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--methods", default="none,ngram,suffix")
    parser.add_argument("--workloads", default="quote,random,sampled,demo,demo-quote")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--output-len", default="128")
    parser.add_argument("--requests-per-slot", type=int, default=1,
                        help="bench-engine --requests = this x the batch: above 1, requests queue for "
                             "the batch's slots as a server runs them (a request that finishes early "
                             "frees its slot), instead of one static batch that lasts as long as its "
                             "slowest request")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "pdserve_speculative"))
    a = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(a.workdir, exist_ok=True)
    quote = os.path.join(a.workdir, "quote-smollm")
    methods = a.methods.split(",")
    rows = []
    for workload in a.workloads.split(","):
        for batch in map(int, a.batches.split(",")):
            common = ["--batch", str(batch), "--output-len", a.output_len, "--threads", a.threads,
                      "--requests", str(batch * a.requests_per_slot)]
            if workload == "quote":
                make_quote_model(a.pdserve, quote)
                path = os.path.join(a.workdir, f"quote-{batch}.txt")
                with open(path, "w") as f:
                    f.write("\n".join(quote_prompts(quote, batch * a.requests_per_slot)) + "\n")
                common += ["--model", quote, "--prompts", path]
            elif workload == "demo-quote":
                demo = os.path.join(root, "models", "pdserve-demo")
                path = os.path.join(a.workdir, f"demo-quote-{batch}.txt")
                with open(path, "w") as f:
                    f.write("\n".join(demo_quote_prompts(a.pdserve, demo, batch * a.requests_per_slot)) + "\n")
                common += ["--model", demo, "--prompts", path]
            elif workload in ("random", "sampled"):
                common += ["--random-weights", "smollm-135m", "--input-len", "256"]
                if workload == "sampled":
                    common += ["--temperature", "1"]
            else:
                common += ["--model", os.path.join(root, "models", "pdserve-demo"), "--input-len", "256"]
            best = {}
            for _ in range(a.rounds):
                for m in methods:
                    j = bench(a.pdserve, [*common, "--speculative", m])
                    if m not in best or j["decode_tok_s"] > best[m]["decode_tok_s"]:
                        best[m] = j
            plain = best.get("none", {}).get("decode_tok_s")
            for m in methods:
                j = best[m]
                rows.append((workload, batch, m, j["decode_tok_s"], j["decode_tok_s"] / plain if plain else None,
                             j.get("spec_acceptance_rate"), j.get("spec_mean_acceptance_length"), j["decode_steps"]))
    print(f"cpu: {best[methods[0]]['cpu']}, threads {a.threads}, best of {a.rounds} interleaved rounds, "
          f"{a.requests_per_slot} request(s) per slot")
    print("| workload | batch | method | decode tok/s | of plain | acceptance | mean accepted length | steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for w, b, m, tok, ratio, acc, mal, steps in rows:
        print(f"| {w} | {b} | {m} | {tok:.1f} | {ratio:.2f}x | "
              f"{'-' if acc is None else f'{acc:.3f}'} | {'-' if mal is None else f'{mal:.2f}'} | {steps} |")


if __name__ == "__main__":
    main()
