#!/usr/bin/python3
"""How far a numeric mode moves pdserve's output from the f32 baseline, on one model.

For each prompt: greedy generation in the baseline (f32 compute, f32 KV pool, batch-invariant
GEMMs) and in each mode, with the logits of every step dumped. Reported per mode: prompts whose
whole greedy continuation equals the baseline's, the mean position of the first differing token
(the length when none differs), the largest relative logit error at the steps before the first
difference (same context in both runs), and the mean and largest KL divergence KL(baseline ||
mode) of the next-token distribution at every position of the baseline's continuation,
teacher-forced: where the mode's greedy token differs, it is restarted on the baseline's tokens
so far (prefill equals decode bitwise in every mode that is not OpenBLAS, so a restart computes
what forcing the token would). Prompts: verses of the model's heldout.txt when it has one (the
demo model), otherwise random token ids (random models, whose near-uniform distributions make
greedy agreement a matter of near-ties).

    /usr/bin/python3 bench/accuracy.py --pdserve build/pdserve --model models/pdserve-demo
"""

import argparse
import json
import os
import random
import subprocess
import tempfile

import numpy as np

BASELINE = ["--compute-dtype", "f32"]
MODES = {
    "bf16 KV pool": ["--compute-dtype", "f32", "--kv-dtype", "bf16"],
    "OpenBLAS prefill GEMM": ["--compute-dtype", "f32", "--prefill-gemm", "openblas"],
    "bf16 compute": ["--compute-dtype", "bf16"],
    # On a CPU with AMX-BF16 "bf16 compute" sums in AMX's order; this is the VDPBF16PS order there.
    "bf16 compute (PDSERVE_AMX=0)": ["--compute-dtype", "bf16"],
    "bf16 compute + bf16 KV pool": ["--compute-dtype", "bf16", "--kv-dtype", "bf16"],
    "int8 KV pool": ["--compute-dtype", "f32", "--kv-dtype", "int8"],
    "int4 KV pool": ["--compute-dtype", "f32", "--kv-dtype", "int4"],
    # Weights quantized as they load (llama.cpp's Q8_0 bytes; Q4_K by its reference search).
    "Q8_0 weights": ["--compute-dtype", "f32", "--weight-dtype", "q8_0"],
    "Q4_K weights": ["--compute-dtype", "f32", "--weight-dtype", "q4_k"],
}
MODE_ENV = {"bf16 compute (PDSERVE_AMX=0)": {"PDSERVE_AMX": "0"}}


def tokenize(pdserve, model, text):
    ids = subprocess.run([pdserve, "tokenize", "--tokenizer", model, "--text", text,
                          "--add-special-tokens"], capture_output=True, text=True, check=True).stdout
    return [int(t) for t in ids.split()]


def prompts_of(pdserve, model, count, length, seed, long_prompts=False):
    held = os.path.join(model, "heldout.txt")
    if os.path.exists(held):
        with open(held) as f:
            verses = [v for chunk in f.read().split("\n\n") for v in chunk.split("\n")[1:] if len(v) > 60]
        rng = random.Random(seed)
        if long_prompts:  # Consecutive verses from a random start, exactly `length` tokens.
            out = []
            for start in rng.sample(range(len(verses) - 200), count):
                text, end = verses[start], start + 1
                while len(tokenize(pdserve, model, text)) < length:
                    text, end = text + "\n" + verses[end], end + 1
                out.append(tokenize(pdserve, model, text)[:length])
            return out
        return [tokenize(pdserve, model, text)[:length] for text in rng.sample(verses, count)]
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(seed)
    return [[rng.randrange(min(vocab, 256), vocab) for _ in range(length)] for _ in range(count)]


def generate(pdserve, model, prompt, tokens, extra, workdir, env=None):
    dump = os.path.join(workdir, "logits.npy")
    out = subprocess.run([pdserve, "generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
                          "--max-tokens", str(tokens), "--temperature", "0", "--ignore-eos", "--format", "json",
                          "--threads", "2", "--kv-memory-gib", "0.1", "--dump-logits", dump, *extra],
                         capture_output=True, text=True, check=True, env={**os.environ, **(env or {})}).stdout
    return json.loads(out)["token_ids"], np.load(dump).astype(np.float64)


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.sum(np.exp(x), axis=-1, keepdims=True))


def teacher_forced(pdserve, model, prompt, base_tokens, extra, workdir, env=None):
    """The mode's logits at every position of the baseline's continuation, and its own greedy
    tokens of the first run."""
    logits, own, pos = [], None, 0
    while pos < len(base_tokens):
        tokens, l = generate(pdserve, model, list(prompt) + list(base_tokens[:pos]),
                             len(base_tokens) - pos, extra, workdir, env)
        if own is None:
            own = tokens
        d = next((i for i, (a, b) in enumerate(zip(tokens, base_tokens[pos:])) if a != b), len(tokens))
        keep = min(d + 1, len(tokens))  # Step d still had the baseline's context.
        logits.extend(l[:keep])
        pos += keep
    return own, np.array(logits)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", default="build/pdserve")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="", help="comma-separated subset of the modes (default: all)")
    ap.add_argument("--long-prompts", action="store_true",
                    help="prompts of consecutive held-out verses, exactly --prompt-len tokens")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="pdserve_accuracy_")
    prompts = prompts_of(args.pdserve, args.model, args.prompts, args.prompt_len, args.seed,
                         args.long_prompts)
    base = [generate(args.pdserve, args.model, p, args.tokens, BASELINE, workdir) for p in prompts]
    print(f"| model | mode | identical greedy continuations | mean first difference (of {args.tokens}) "
          f"| max relative logit error before it | mean KL (nats) | max KL | positions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, extra in MODES.items():
        if args.modes and mode not in args.modes.split(","):
            continue
        same, first, worst, kls = 0, [], 0.0, []
        for prompt, (tokens, logits) in zip(prompts, base):
            t2, l2 = teacher_forced(args.pdserve, args.model, prompt, tokens, extra, workdir,
                                    MODE_ENV.get(mode))
            p_base = log_softmax(logits)
            p_mode = log_softmax(l2)
            kls.extend(np.sum(np.exp(p_base) * (p_base - p_mode), axis=-1))
            diff = next((i for i, (a, b) in enumerate(zip(tokens, t2)) if a != b), len(tokens))
            same += diff == len(tokens)
            first.append(diff)
            for step in range(min(diff + 1, len(tokens))):
                err = np.max(np.abs(l2[step] - logits[step])) / np.max(np.abs(logits[step]))
                worst = max(worst, err)
        print(f"| {os.path.basename(os.path.normpath(args.model))} | {mode} | {same}/{len(prompts)} "
              f"| {np.mean(first):.1f} | {worst:.1e} | {np.mean(kls):.2e} | {np.max(kls):.2e} | {len(kls)} |",
              flush=True)


if __name__ == "__main__":
    main()
