#!/usr/bin/python3
"""Held-out perplexity of a model in each weight format, as pdserve computes it.

The model is converted by `pdserve gguf convert` to each format (f32, bf16, q8_0, q4_k); the
weights are read back from each file by llama.cpp's gguf-py (its own dequantizers) and the
held-out text (the demo model's heldout.txt: each chapter BOS, its verses, EOS, read in windows of
the training length) goes through the float64 numpy reference (tests/reference). pdserve's engine
equals that reference on these files within ~5e-7 of the logits' range (tests/gguf), so this is
the perplexity pdserve's engine gives each format, computed without its kernels' roundings.

    /usr/bin/python3 bench/quant_accuracy.py --pdserve build/pdserve --model models/pdserve-demo
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gguf"))
import hf_reference  # noqa: E402


def held_out_stream(pdserve, model):
    with open(os.path.join(model, "heldout.txt")) as f:
        chunks = [c for c in f.read().split("\n\n") if c.strip()]
    texts = [c.split("\n", 1)[1] + "\n" for c in chunks]
    jsonl = os.path.join(tempfile.mkdtemp(prefix="pdserve_qacc_"), "heldout.jsonl")
    with open(jsonl, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    out = subprocess.run([pdserve, "tokenize", "--tokenizer", model, "--input-jsonl", jsonl],
                         check=True, capture_output=True, text=True).stdout
    stream = []
    for line in out.splitlines():
        stream += [config["bos_token_id"]] + json.loads(line)["token_ids"] + [config["eos_token_id"]]
    return stream


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", default="build/pdserve")
    ap.add_argument("--model", required=True)
    ap.add_argument("--types", default="f32,bf16,q8_0,q4_k,q4_k_m")
    args = ap.parse_args()
    gguf_path = subprocess.run([os.path.join(ROOT, "scripts", "gguf_py_setup.sh")], check=True,
                               capture_output=True, text=True).stdout.strip()
    sys.path.insert(0, gguf_path)
    import test_gguf  # noqa: E402  (its GGUF -> HF weight reader, on gguf-py)
    import gguf  # noqa: E402
    test_gguf.gguf = gguf
    with open(os.path.join(args.model, "training.json")) as f:
        window = json.load(f)["held_out_window"]
    stream = held_out_stream(args.pdserve, args.model)
    cfg = hf_reference.Config(args.model)
    work = tempfile.mkdtemp(prefix="pdserve_qacc_")
    base = None
    print("| model | weights | bits per weight (matrices) | held-out perplexity | vs f32 |")
    print("| --- | --- | --- | --- | --- |")
    for t in args.types.split(","):
        path = os.path.join(work, f"model-{t}.gguf")
        subprocess.run([args.pdserve, "gguf", "convert", args.model, path, "--type", t], check=True)
        weights, act_blocks = test_gguf.reference_weights(path, cfg, llama=cfg.arch == "LlamaForCausalLM")
        ppl, _ = hf_reference.perplexity(cfg, weights, stream, window, act_blocks)
        base = base or ppl
        matrices = [m for m in gguf.GGUFReader(path).tensors if len(m.shape) == 2]
        bits = round(8 * sum(int(m.n_bytes) for m in matrices) / sum(int(m.n_elements) for m in matrices), 2)
        print(f"| {os.path.basename(os.path.normpath(args.model))} | {t} | {bits} | {ppl:.4f} | "
              f"{(ppl / base - 1) * 100:+.2f}% |", flush=True)


if __name__ == "__main__":
    main()
