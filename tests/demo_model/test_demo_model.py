"""The trained demo model that ships with pdserve (models/pdserve-demo): its files are the ones
recorded at training, it speaks the language of its corpus, and its held-out perplexity recomputed
by the float64 numpy reference equals the figure recorded at training. Likewise its LoRA adapter
(models/pdserve-demo-lora, trained on the Psalms): its files, the held-out psalms' perplexity
under the base and under the adapter as recorded, the adapter's lower, and pdserve serving it
(`serve --lora-modules`, the OpenAI API's model) as the reference predicts. (Parity of pdserve's
logits with the reference on both is in tests/reference/test_parity.py.)

Run: /usr/bin/python3 tests/demo_model/test_demo_model.py --pdserve build/pdserve
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import hf_reference  # noqa: E402

MODEL = os.path.join(ROOT, "models", "pdserve-demo")
ADAPTER = os.path.join(ROOT, "models", "pdserve-demo-lora")
PDSERVE = None
WORKDIR = None
PROMPTS = ["In the beginning", "And the LORD said unto Moses,", "Blessed are they that",
           "The king of Babylon", "And Jesus answered and said"]


def run(*args):
    return subprocess.run([PDSERVE, *map(str, args)], capture_output=True, text=True, check=True).stdout


def words_of(text):
    return re.findall(r"[a-z]+", text.lower())


class DemoModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(MODEL, "training.json")) as f:
            cls.training = json.load(f)
        with open(os.path.join(MODEL, "words.txt")) as f:
            cls.vocabulary = set(f.read().split())

    def test_files_match_their_checksums(self):
        with open(os.path.join(MODEL, "SHA256SUMS")) as f:
            lines = [line.split() for line in f if line.strip()]
        names = {name for _, name in lines}
        for must in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                     "generation_config.json", "training.json", "heldout.txt", "words.txt", "loss.tsv"):
            self.assertIn(must, names)
        for digest, name in lines:
            with open(os.path.join(MODEL, name), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest, name)

    def generate(self, model, prompt, extra):
        out = run("generate", "--model", model, "--prompt", prompt, "--max-tokens", 48, "--format", "json",
                  "--threads", 2, "--kv-memory-gib", 0.05, *extra)
        return json.loads(out)["text"]

    def fraction_in_corpus(self, model):
        generated = []
        for i, prompt in enumerate(PROMPTS):
            generated += words_of(self.generate(model, prompt, ["--temperature", 0]))
            generated += words_of(self.generate(model, prompt, ["--temperature", 0.8, "--seed", i]))
        self.assertGreater(len(generated), 100)
        return sum(w in self.vocabulary for w in generated) / len(generated), generated

    def test_continuations_are_words_of_the_corpus(self):
        demo, words = self.fraction_in_corpus(MODEL)
        self.assertGreaterEqual(demo, 0.9, " ".join(words))
        # The control: a random model of the same shape with the same tokenizer. Its tokens are
        # the corpus' own word pieces, so about half of what it strings together happen to be
        # words (0.50 measured; deterministic: fixed seeds, bitwise-reproducible engine), far
        # below what the trained weights reach.
        random_model = os.path.join(WORKDIR, "random")
        with open(os.path.join(MODEL, "config.json")) as f:
            c = json.load(f)
        run("make-model", random_model, "--layers", c["num_hidden_layers"], "--hidden", c["hidden_size"],
            "--heads", c["num_attention_heads"], "--kv-heads", c["num_key_value_heads"],
            "--intermediate", c["intermediate_size"], "--vocab", c["vocab_size"], "--seed", 1)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(MODEL, name), os.path.join(random_model, name))
        control, words = self.fraction_in_corpus(random_model)
        print(f"\n  words in the corpus: demo {demo:.3f}, random {control:.3f}", file=sys.stderr)
        self.assertLess(control, 0.75, " ".join(words))

    def test_held_out_perplexity_matches_training(self):
        """The held-out split, tokenized as at training (each chapter: BOS, its verses, EOS) and read
        in windows of the training length, through the float64 reference."""
        with open(os.path.join(MODEL, "heldout.txt")) as f:
            chunks = [c for c in f.read().split("\n\n") if c.strip()]
        texts = [c.split("\n", 1)[1] + "\n" for c in chunks]  # Drop the chapter label line.
        jsonl = os.path.join(WORKDIR, "heldout.jsonl")
        with open(jsonl, "w") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        with open(os.path.join(MODEL, "config.json")) as f:
            config = json.load(f)
        bos, eos = config["bos_token_id"], config["eos_token_id"]
        stream = []
        for line in run("tokenize", "--tokenizer", MODEL, "--input-jsonl", jsonl).splitlines():
            stream += [bos] + json.loads(line)["token_ids"] + [eos]
        self.assertEqual(len(stream), self.training["held_out_tokens"])
        cfg = hf_reference.Config(MODEL)
        weights = hf_reference.load_weights(MODEL)
        ppl, count = hf_reference.perplexity(cfg, weights, stream, self.training["held_out_window"])
        self.assertEqual(count, self.training["held_out_predicted_tokens"])
        recorded = self.training["held_out_perplexity"]
        print(f"\n  held-out perplexity {ppl:.4f} (recorded {recorded:.4f})", file=sys.stderr)
        self.assertLess(abs(ppl - recorded) / recorded, 0.01)


class DemoAdapterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(ADAPTER, "training.json")) as f:
            cls.training = json.load(f)

    def test_files_match_their_checksums(self):
        with open(os.path.join(ADAPTER, "SHA256SUMS")) as f:
            for line in f:
                digest, name = line.split()
                with open(os.path.join(ADAPTER, name), "rb") as g:
                    self.assertEqual(hashlib.sha256(g.read()).hexdigest(), digest, name)

    def held_out_stream(self):
        """The held-out psalms tokenized as at training: each psalm's verses, no BOS or EOS."""
        with open(os.path.join(ADAPTER, "heldout.txt")) as f:
            chunks = [c for c in f.read().split("\n\n") if c.strip()]
        self.assertEqual([c.split("\n", 1)[0] for c in chunks], self.training["held_out_psalms"])
        jsonl = os.path.join(WORKDIR, "psalms.jsonl")
        with open(jsonl, "w") as f:
            for c in chunks:
                f.write(json.dumps({"text": c.split("\n", 1)[1] + "\n"}) + "\n")
        stream = []
        for line in run("tokenize", "--tokenizer", MODEL, "--input-jsonl", jsonl).splitlines():
            stream += json.loads(line)["token_ids"]
        self.assertEqual(len(stream), self.training["held_out_tokens"])
        return stream

    def test_held_out_psalms_perplexity_matches_training_and_the_adapter_lowers_it(self):
        stream = self.held_out_stream()
        cfg = hf_reference.Config(MODEL)
        weights = hf_reference.load_weights(MODEL)
        window = self.training["held_out_window"]
        base, count = hf_reference.perplexity(cfg, weights, stream, window)
        adapted, _ = hf_reference.perplexity(cfg, weights, stream, window, lora=hf_reference.load_lora(ADAPTER))
        self.assertEqual(count, self.training["held_out_predicted_tokens"])
        print(f"\n  held-out psalms: base {base:.4f} (recorded {self.training['held_out_perplexity_base']:.4f}), "
              f"adapter {adapted:.4f} (recorded {self.training['held_out_perplexity_adapter']:.4f})", file=sys.stderr)
        self.assertLess(abs(base - self.training["held_out_perplexity_base"]) / base, 0.01)
        self.assertLess(abs(adapted - self.training["held_out_perplexity_adapter"]) / adapted, 0.01)
        self.assertLess(adapted, base)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_demo_")
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
