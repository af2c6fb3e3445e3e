"""llama.cpp's own tokenizer against pdserve's on the same GGUF vocabulary, over the oracle corpus.

pdserve reads a GGUF vocabulary as the tokenizer.json it stands for (common/model/gguf_tokenizer);
llama.cpp's `llama-tokenize` runs its own implementation (for SentencePiece files: the bigram
merge by score). Both with special tokens added and parsed. Needs llama.cpp's build
(`ninja -C .cache/llama.cpp/build llama-tokenize`, see BUILD-NOTES); not part of the tests.

Run: /usr/bin/python3 bench/llama_tokenize_parity.py --pdserve build/pdserve --gguf F.gguf
"""

import argparse
import ast
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--llama-tokenize", default=os.path.join(ROOT, ".cache/llama.cpp/build/bin/llama-tokenize"))
    parser.add_argument("--corpus", default=os.path.join(ROOT, "tests/tokenizer/corpus.jsonl"))
    args = parser.parse_args()
    texts = [json.loads(line)["text"] for line in open(args.corpus, encoding="utf-8") if line.strip()]
    ours = subprocess.run([args.pdserve, "tokenize", "--tokenizer", args.gguf, "--input-jsonl", args.corpus,
                           "--add-special-tokens"], check=True, capture_output=True).stdout.decode()
    ours = [json.loads(line)["token_ids"] for line in ours.split("\n") if line]
    differ = 0
    for text, want in zip(texts, ours):
        p = subprocess.run([args.llama_tokenize, "-m", args.gguf, "--stdin", "--ids", "--log-disable"],
                           input=text.encode(), capture_output=True, check=True)
        theirs = ast.literal_eval(p.stdout.decode().strip().splitlines()[-1])
        if theirs != want:
            differ += 1
            print(f"differs: {text[:60]!r}\n  llama.cpp {theirs[:16]}\n  pdserve   {want[:16]}")
    print(f"{len(texts)} texts, {differ} differ")


if __name__ == "__main__":
    main()
