#!/usr/bin/python3
"""pdserve's perplexity on a llama.cpp GGUF file in llama-perplexity's scheme, to set beside
`llama-perplexity -m FILE -f TEXT -c CTX` on the same file and text.

llama-perplexity tokenizes the whole text once (BOS first), cuts it into windows of CTX tokens,
puts BOS in each window's first position, and scores only the second half of each window (each
token from position CTX/2 on, predicted from everything before it in its window). This script does
the same with the float64 numpy reference (tests/reference) on the file's tensors as llama.cpp's
gguf-py dequantizes them, quantizing each quantized matrix's input as pdserve's integer kernels do
(tests/gguf holds the engine to this reference within 1e-5 of the logits' range), and with pdserve's
tokenizer (GGUF vocabularies encode as their tokenizer.json, tests/tokenizer).

    /usr/bin/python3 bench/llama_perplexity_parity.py --model DIR --gguf FILE --text TEXT --ctx 256
"""

import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gguf"))
import hf_reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", default=os.path.join(ROOT, "build", "pdserve"))
    ap.add_argument("--model", required=True, help="the Hugging Face directory (config, tokenizer)")
    ap.add_argument("--gguf", required=True, help="the GGUF file llama-perplexity reads")
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    args = ap.parse_args()
    gguf_path = subprocess.run([os.path.join(ROOT, "scripts", "gguf_py_setup.sh")], check=True,
                               capture_output=True, text=True).stdout.strip()
    sys.path.insert(0, gguf_path)
    import test_gguf  # noqa: E402
    import gguf  # noqa: E402
    test_gguf.gguf = gguf
    with open(args.text) as f:
        text = f.read()
    out = subprocess.run([args.pdserve, "tokenize", "--tokenizer", args.model, "--text", text,
                          "--format", "json"], check=True, capture_output=True, text=True).stdout
    ids = json.loads(out)["token_ids"]
    cfg = hf_reference.Config(args.model)
    with open(os.path.join(args.model, "config.json")) as f:
        bos = json.load(f)["bos_token_id"]
    # BOS as llama.cpp adds it: when the file's tokenizer.ggml.add_bos_token says so.
    field = gguf.GGUFReader(args.gguf).get_field("tokenizer.ggml.add_bos_token")
    add_bos = field is not None and bool(field.parts[-1][0])
    tokens = ([bos] if add_bos else []) + ids
    weights, act_blocks = test_gguf.reference_weights(args.gguf, cfg, llama=cfg.arch == "LlamaForCausalLM")
    n, first = args.ctx, args.ctx // 2
    nll, count = 0.0, 0
    for start in range(0, len(tokens) // n * n, n):
        window = ([bos] if add_bos else tokens[start:start + 1]) + tokens[start + 1:start + n]
        logits = hf_reference.forward(cfg, weights, window, act_blocks=act_blocks)
        logits = logits - logits.max(axis=-1, keepdims=True)
        logz = np.log(np.exp(logits).sum(axis=-1))
        for j in range(first, n - 1):
            nll -= float(logits[j, window[j + 1]] - logz[j])
            count += 1
    print(json.dumps({"tokens": len(tokens), "add_bos": add_bos, "chunks": len(tokens) // n, "scored": count,
                      "perplexity": math.exp(nll / count)}))


if __name__ == "__main__":
    main()
