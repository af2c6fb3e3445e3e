"""End-to-end checks of the pdserve binary as a user runs it: kv-calc against the formula,
generate's JSON contract and determinism, and every bad input ending in a clear error.

Run: /usr/bin/python3 tests/cli_test.py --pdserve build/pdserve
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

PDSERVE = None
WORKDIR = None


def pdserve(*args, env=None):
    return subprocess.run([PDSERVE, *map(str, args)], capture_output=True, text=True, env=env)


def ok(*args):
    p = pdserve(*args)
    if p.returncode != 0:
        raise AssertionError(f"pdserve {' '.join(map(str, args))}: {p.stderr}")
    return p.stdout


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}


class KvCalcTest(unittest.TestCase):
    def calc(self, config, *flags):
        path = os.path.join(WORKDIR, "config.json")
        write_json(path, config)
        return json.loads(ok("kv-calc", "--config", path, "--format", "json", *flags))

    def test_llama_31_8b(self):
        out = self.calc(LLAMA_31_8B, "--seq-len", "8192", "--batch", "4", "--memory-gib", "16")
        bpt = 2 * 32 * 8 * 128 * 2  # K and V x layers x kv heads x head_dim x bf16
        self.assertEqual(out["bytes_per_token"], bpt)
        self.assertEqual(out["total_bytes"], 4 * 8192 * bpt)
        self.assertEqual(out["max_tokens"], 16 * 2**30 // bpt)

    def test_dtypes_and_defaults(self):
        out = self.calc(QWEN3_8B, "--kv-dtype", "f32")
        self.assertEqual(out["bytes_per_token"], 2 * 36 * 8 * 128 * 4)
        self.assertEqual(out["seq_len"], 40960)
        self.assertIsNone(out["max_tokens"])
        # int8/int4: codes plus one f32 scale per (token, layer, K|V, kv head) row, as the pool.
        for dtype, row in (("int8", 128 + 4), ("int4", 64 + 4)):
            q = self.calc(QWEN3_8B, "--kv-dtype", dtype, "--memory-gib", "1", "--seq-len", "1000")
            self.assertEqual(q["bytes_per_token"], 2 * 36 * 8 * row, dtype)
            self.assertEqual(q["scale_bytes"], 1000 * 2 * 36 * 8 * 4, dtype)
            self.assertEqual(q["max_tokens"], (2**30 // (16 * q["bytes_per_token"])) * 16, dtype)

    def test_text_mode_and_errors(self):
        path = os.path.join(WORKDIR, "config.json")
        write_json(path, LLAMA_31_8B)
        text = ok("kv-calc", "--config", path, "--memory-gib", "8")
        self.assertIn("131072", text)
        bad = pdserve("kv-calc", "--config", path, "--kv-dtype", "fp8")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--kv-dtype", bad.stderr)
        both = pdserve("kv-calc")
        self.assertEqual(both.returncode, 2)


class GenerateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = os.path.join(WORKDIR, "model")
        ok("make-model", cls.model, "--arch", "qwen2", "--vocab", "600", "--seed", "2")

    def generate(self, *flags):
        return json.loads(ok("generate", "--model", self.model, "--format", "json",
                             "--kv-memory-gib", "0.05", *flags))

    def test_json_contract(self):
        out = self.generate("--prompt", "The quick brown fox", "--max-tokens", "7", "--logprobs", "3",
                            "--temperature", "0", "--ignore-eos")
        self.assertEqual(len(out["token_ids"]), 7)
        self.assertEqual(len(out["logprobs"]), 7)
        self.assertEqual(len(out["top_logprobs"]), 7)
        self.assertEqual(out["finish_reason"], "length")
        self.assertEqual(out["usage"]["completion_tokens"], 7)
        # Greedy: the chosen token is the top alternative and its logprob matches.
        for i, step in enumerate(out["top_logprobs"]):
            self.assertEqual(step[0]["token_id"], out["token_ids"][i])
            self.assertAlmostEqual(step[0]["logprob"], out["logprobs"][i], places=6)
            self.assertLessEqual(out["logprobs"][i], 0.0)
        self.assertGreater(out["timing"]["ttft_ms"], 0)
        self.assertIsInstance(out["text"], str)

    def test_prompt_text_encodes_with_bos(self):
        ids = self.generate("--prompt", "the server", "--max-tokens", "1")
        raw = self.generate("--prompt", "the server", "--max-tokens", "1", "--no-add-special-tokens")
        self.assertEqual(ids["usage"]["prompt_tokens"], raw["usage"]["prompt_tokens"] + 1)

    def test_seeded_sampling_is_reproducible(self):
        a = self.generate("--prompt-ids", "5,6,7,8", "--max-tokens", "12", "--seed", "99",
                          "--temperature", "0.9", "--top-p", "0.95", "--ignore-eos")
        b = self.generate("--prompt-ids", "5,6,7,8", "--max-tokens", "12", "--seed", "99",
                          "--temperature", "0.9", "--top-p", "0.95", "--ignore-eos", "--threads", "1")
        self.assertEqual(a["token_ids"], b["token_ids"])
        self.assertEqual(a["logprobs"], b["logprobs"])  # Bitwise, through JSON's round trip.

    def test_bad_requests(self):
        bad_id = pdserve("generate", "--model", self.model, "--prompt-ids", "1,600")
        self.assertEqual(bad_id.returncode, 1)
        self.assertIn("600", bad_id.stderr)
        both = pdserve("generate", "--model", self.model, "--prompt", "x", "--prompt-ids", "1")
        self.assertEqual(both.returncode, 2)
        unknown = pdserve("generate", "--model", self.model, "--prompt", "x", "--tempurature", "1")
        self.assertEqual(unknown.returncode, 2)
        self.assertIn("--tempurature", unknown.stderr)
        top_p = pdserve("generate", "--model", self.model, "--prompt", "x", "--top-p", "0")
        self.assertEqual(top_p.returncode, 2)
        self.assertIn("--top-p", top_p.stderr)
        # A sampling flag out of range is a usage error (exit 2), like any other bad flag.
        temperature = pdserve("generate", "--model", self.model, "--prompt", "x", "--temperature", "-1")
        self.assertEqual(temperature.returncode, 2, temperature.stderr)
        self.assertIn("--temperature", temperature.stderr)
        invalid_utf8 = subprocess.run([PDSERVE, "generate", "--model", self.model, "--prompt",
                                       b"ok\xff".decode("latin-1").encode("latin-1")],
                                      capture_output=True)
        self.assertEqual(invalid_utf8.returncode, 1)
        self.assertIn(b"UTF-8", invalid_utf8.stderr)


    def test_compute_dtype(self):
        # bf16 compute on this f32 model (weights converted at load) moves the logprobs a little
        # and keeps seeded runs bitwise reproducible; the environment variable sets it too.
        flags = ("--prompt-ids", "5,6,7,8", "--max-tokens", "6", "--temperature", "0", "--ignore-eos")
        f32 = self.generate(*flags, "--compute-dtype", "f32")
        bf16 = self.generate(*flags, "--compute-dtype", "bf16")
        self.assertNotEqual(f32["logprobs"], bf16["logprobs"])
        self.assertLess(max(abs(a - b) for a, b in zip(f32["logprobs"], bf16["logprobs"])), 0.1)
        env = dict(os.environ, PDSERVE_COMPUTE_DTYPE="bf16")
        again = json.loads(subprocess.run([PDSERVE, "generate", "--model", self.model, "--format", "json",
                                           "--kv-memory-gib", "0.05", *flags], env=env,
                                          capture_output=True, text=True, check=True).stdout)
        self.assertEqual(again["logprobs"], bf16["logprobs"])
        bad = pdserve("generate", "--model", self.model, "--prompt-ids", "1", "--compute-dtype", "f16")
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--compute-dtype", bad.stderr)
        self.assertIn("'f16'", bad.stderr)
        clash = pdserve("generate", "--model", self.model, "--prompt-ids", "1", "--compute-dtype", "bf16",
                        "--prefill-gemm", "openblas")
        self.assertNotEqual(clash.returncode, 0)
        self.assertIn("--prefill-gemm openblas", clash.stderr)

class TokenizeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = os.path.join(WORKDIR, "tok_model")
        ok("make-model", cls.model, "--vocab", "700", "--seed", "4")

    def test_round_trip_and_formats(self):
        text = "Hello, world: 12345 héllo 世界 🎉"
        ids = json.loads(ok("tokenize", "--tokenizer", self.model, "--text", text, "--format", "json"))["token_ids"]
        plain = ok("tokenize", "--tokenizer", os.path.join(self.model, "tokenizer.json"), "--text", text)
        self.assertEqual(list(map(int, plain.split())), ids)
        back = json.loads(ok("detokenize", "--tokenizer", self.model, "--ids", ",".join(map(str, ids)),
                             "--stream", "--format", "json"))
        self.assertEqual(back["text"], text)
        self.assertEqual("".join(back["stream"]), text)
        with_bos = json.loads(ok("tokenize", "--tokenizer", self.model, "--text", text,
                                 "--add-special-tokens", "--format", "json"))["token_ids"]
        self.assertEqual(with_bos[1:], ids)

    def test_jsonl(self):
        path = os.path.join(WORKDIR, "in.jsonl")
        with open(path, "w") as f:
            f.write('{"text": "a b"}\n{"text": ""}\n{"text": "<|end_of_text|>"}\n')
        lines = [json.loads(l) for l in ok("tokenize", "--tokenizer", self.model, "--input-jsonl", path).splitlines()]
        self.assertEqual(len(lines), 3)
        self.assertEqual(lines[1]["token_ids"], [])
        self.assertEqual(len(lines[2]["token_ids"]), 1)  # The special token is one id.
        with open(path, "w") as f:
            f.write('{"text": "fine"}\n{"txt": "typo"}\n')
        bad = pdserve("tokenize", "--tokenizer", self.model, "--input-jsonl", path)
        self.assertEqual(bad.returncode, 1)
        self.assertIn(":2:", bad.stderr)
        self.assertIn("text", bad.stderr)

    def test_bad_input(self):
        invalid = subprocess.run([PDSERVE, "tokenize", "--tokenizer", self.model, "--text", b"ok\xff"],
                                 capture_output=True)
        self.assertEqual(invalid.returncode, 1)
        self.assertIn(b"UTF-8", invalid.stderr)
        out_of_vocab = pdserve("detokenize", "--tokenizer", self.model, "--ids", "1,99999")
        self.assertEqual(out_of_vocab.returncode, 1)
        self.assertIn("99999", out_of_vocab.stderr)
        wordpiece = os.path.join(WORKDIR, "wordpiece")
        os.makedirs(wordpiece, exist_ok=True)
        write_json(os.path.join(wordpiece, "tokenizer.json"),
                   {"model": {"type": "WordPiece", "vocab": {"a": 0}}})
        unsupported = pdserve("tokenize", "--tokenizer", wordpiece, "--text", "a")
        self.assertEqual(unsupported.returncode, 1)
        self.assertIn("WordPiece", unsupported.stderr)
        missing = pdserve("tokenize", "--tokenizer", os.path.join(WORKDIR, "none"), "--text", "a")
        self.assertEqual(missing.returncode, 1)
        self.assertIn("none", missing.stderr)


class BadModelTest(unittest.TestCase):
    """Every bad model input ends in an error naming the file and the tensor, never a crash."""

    def fresh(self, name, *flags):
        d = os.path.join(WORKDIR, name)
        shutil.rmtree(d, ignore_errors=True)
        ok("make-model", d, "--vocab", "300", *flags)
        return d

    def expect_error(self, model, *needles):
        p = pdserve("generate", "--model", model, "--prompt-ids", "1,2", "--max-tokens", "1")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertNotIn("Segmentation", p.stderr)
        for n in needles:
            self.assertIn(n, p.stderr)

    def rewrite_header(self, path, edit):
        with open(path, "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        edit(header)
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + data[8 + n:])

    def test_truncated(self):
        d = self.fresh("truncated")
        path = os.path.join(d, "model.safetensors")
        os.truncate(path, os.path.getsize(path) - 64)
        self.expect_error(d, "model.safetensors", "truncated")

    def test_corrupt_header(self):
        d = self.fresh("corrupt")
        path = os.path.join(d, "model.safetensors")
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(b"#garbage")
        self.expect_error(d, "model.safetensors", "header")

    def test_missing_tensor(self):
        d = self.fresh("missing")
        self.rewrite_header(os.path.join(d, "model.safetensors"),
                            lambda h: h.pop("model.layers.1.self_attn.o_proj.weight"))
        self.expect_error(d, "model.layers.1.self_attn.o_proj.weight", "model.safetensors")

    def test_wrong_shape(self):
        d = self.fresh("shape")

        def edit(h):
            h["model.norm.weight"]["shape"] = [32, 2]
        self.rewrite_header(os.path.join(d, "model.safetensors"), edit)
        self.expect_error(d, "model.norm.weight", "[32, 2]", "[64]")

    def test_unsupported_dtype(self):
        d = self.fresh("dtype")

        def edit(h):
            h["model.norm.weight"]["dtype"] = "I32"
        self.rewrite_header(os.path.join(d, "model.safetensors"), edit)
        self.expect_error(d, "model.norm.weight", "I32")

    def test_unknown_architecture(self):
        d = self.fresh("arch")
        cfg_path = os.path.join(d, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["architectures"] = ["FalconForCausalLM"]
        write_json(cfg_path, cfg)
        self.expect_error(d, "config.json", "FalconForCausalLM")

    def test_missing_shard(self):
        d = self.fresh("shard", "--shards", "2")
        os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
        self.expect_error(d, "model-00002-of-00002.safetensors")

    def test_not_a_model_dir(self):
        self.expect_error(os.path.join(WORKDIR, "nowhere"), "nowhere")


class ProfileTest(unittest.TestCase):
    """pdserve profile: the points it measured, the fit it wrote (checked here by recomputing
    every prediction from the coefficients), the transfer fit, the roofline against the formula."""

    def test_measured_profile(self):
        model = os.path.join(WORKDIR, "profile_model")
        ok("make-model", model, "--arch", "llama", "--layers", "2", "--hidden", "64", "--heads", "4",
           "--kv-heads", "2", "--vocab", "512", "--seed", "3")
        out = os.path.join(WORKDIR, "profile.json")
        ok("profile", "--model", model, "--threads", "1", "--out", out, "--chunks", "16,64,128",
           "--contexts", "0,64", "--batches", "1,4,8", "--decode-contexts", "32,96", "--repeats", "2",
           "--decode-steps", "5", "--kv-memory-gib", "0.05")
        with open(out) as f:
            p = json.load(f)
        self.assertEqual((p["format"], p["modelled"]), ("pdserve-profile-v1", False))
        self.assertEqual((p["model"]["num_layers"], p["model"]["hidden_size"]), (2, 64))
        points = p["points"]
        self.assertEqual([q["kind"] for q in points], ["prefill"] * 6 + ["decode"] * 6)
        fit = p["step_cost"]
        coef = [fit["a_seconds"], fit["b_per_token"], fit["c_per_prefill_pair"], fit["d_per_sequence"],
                fit["e_per_decode_key"], fit["f_decode_only_seconds"]]
        for c in coef:
            self.assertGreaterEqual(c, 0)
        worst = 0
        for i, q in enumerate(points):
            if q["kind"] == "prefill":
                n, ctx = [(n, ctx) for ctx in (0, 64) for n in (16, 64, 128)][i]
                self.assertEqual((q["tokens"], q["sequences"], q["decode_context"]), (n, 1, 0))
                self.assertEqual(q["prefill_pairs"], n * (ctx + (n + 1) / 2))
            else:
                batch = (1, 4, 8)[(i - 6) % 3]
                self.assertEqual((q["tokens"], q["sequences"], q["prefill_pairs"]), (batch, batch, 0))
                self.assertGreaterEqual(q["decode_context"], batch * (32 if i < 9 else 96))
            predicted = (coef[0] + coef[1] * q["tokens"] + coef[2] * q["prefill_pairs"] +
                         coef[3] * q["sequences"] + coef[4] * q["decode_context"] +
                         (coef[5] if q["prefill_pairs"] == 0 else 0))
            self.assertAlmostEqual(predicted, q["predicted_seconds"], delta=1e-12 + 1e-9 * predicted)
            self.assertGreater(q["seconds"], 0)
            worst = max(worst, abs(predicted - q["seconds"]) / q["seconds"])
        self.assertAlmostEqual(worst, fit["max_relative_error"])
        t = p["transport"]
        page = 2 * 2 * 16 * 16 * 4  # K and V, 2 KV heads, 16 tokens, 16 dims, f32.
        mib = (1 << 20) // page + 1
        self.assertEqual((t["name"], t["page_bytes"]), ("tcp", page))
        self.assertEqual([(x["pages"], x["bytes"]) for x in t["points"]],
                         [(1, page), (mib, mib * page), (16 * mib, 16 * mib * page)])
        self.assertGreater(t["bytes_per_second"], 0)

    def test_roofline_profile_is_the_formula(self):
        path = os.path.join(WORKDIR, "config.json")
        write_json(path, LLAMA_31_8B)
        p = json.loads(ok("profile", "--model", path, "--roofline-gbps", "4800", "--roofline-tflops", "989"))
        self.assertTrue(p["modelled"])
        h, i, layers, heads, kv, hd, vocab = 4096, 14336, 32, 32, 8, 128, 128256
        params = layers * (2 * h * heads * hd + 2 * h * kv * hd + 3 * h * i + 2 * h) + 2 * vocab * h + h
        self.assertEqual(p["model"]["parameters"], params)
        c = p["step_cost"]
        self.assertAlmostEqual(c["a_seconds"], params * 2 / 4800e9)
        self.assertAlmostEqual(c["b_per_token"], 2 * params / 989e12)
        self.assertAlmostEqual(c["c_per_prefill_pair"], 4 * layers * heads * hd / 989e12)
        self.assertAlmostEqual(c["e_per_decode_key"], 2 * layers * kv * hd * 2 / 4800e9)
        self.assertNotIn("points", p)

    def test_bad_flags_name_them(self):
        for args, flag in ((["--model", "m", "--chunks", "1,16"], "--chunks"),
                           (["--model", "m", "--roofline-gbps", "100"], "--roofline-gbps"),
                           (["--model", "m", "--batches", "4,x"], "--batches"),
                           (["--model", "m", "--transport", "rdma"], "--transport"),
                           (["--chunks", "16"], "--model")):
            r = pdserve("profile", *args)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(flag, r.stderr)


class SimulateTest(unittest.TestCase):
    """pdserve simulate: bench's figures by bench's names, a roofline profile marked modelled,
    a trace's shared prefixes hitting the cache, and bad input refused by name."""

    PROFILE = {"format": "pdserve-profile-v1", "modelled": True,
               "model": {"name": "m", "vocab_size": 1000, "num_layers": 2, "num_kv_heads": 2, "head_dim": 8},
               "step_cost": {"a_seconds": 0.01, "b_per_token": 1e-4, "c_per_prefill_pair": 0,
                             "d_per_sequence": 0, "e_per_decode_key": 0},
               "transport": {"latency_seconds": 0.001, "bytes_per_second": 1e9}}

    # Each run passes --kv-blocks: this profile's 128-byte tokens would give a 4 GiB default pool
    # two million blocks per worker, and the simulator allocates the real BlockManager's.

    def setUp(self):
        self.profile = os.path.join(WORKDIR, "sim_profile.json")
        write_json(self.profile, self.PROFILE)

    def test_json_has_bench_keys_and_exact_costs(self):
        # One request of 100 tokens, alone: prefill 10 + 10 ms, pages 1 ms + 100 x 128 B / 1 GB/s
        # (2 x 2 layers x 2 KV heads x 8 x 2 bytes a token) streamed per layer: the first layer's
        # half leaves during the step, the second's after it,
        # then 4 decode steps of 10.1 ms.
        j = json.loads(ok("simulate", "--profile", self.profile, "--kv-blocks", "2048", "--prefill", "1", "--decode", "1",
                          "--num-prompts", "1", "--input-len", "100", "--output-len", "5", "--format", "json"))
        for key in ("request_rate", "ok", "failed", "duration_s", "hit_rate", "ttft_p50_ms", "tpot_p99_ms",
                    "itl_mean_ms", "e2el_p90_ms", "goodput", "local_prefills", "remote_prefills"):
            self.assertIn(key, j)
        self.assertTrue(j["modelled"])
        self.assertEqual((j["ok"], j["remote_prefills"]), (1, 1))
        self.assertAlmostEqual(j["ttft_mean_ms"], 20 + 1 + 100 * 128 / 2 / 1e9 * 1e3, places=6)
        self.assertAlmostEqual(j["tpot_mean_ms"], 10.1, places=6)
        self.assertEqual([w["tier"] for w in j["workers"]], ["prefill", "decode"])

    def test_trace_prefixes_hit_the_cache(self):
        trace = os.path.join(WORKDIR, "trace.jsonl")
        with open(trace, "w") as f:
            for i in range(6):
                f.write(json.dumps({"timestamp": 1000 * i, "input_length": 1500, "output_length": 4,
                                    "hash_ids": [7, 8, 100 + i]}) + "\n")
        j = json.loads(ok("simulate", "--profile", self.profile, "--kv-blocks", "2048", "--prefill", "0", "--decode", "1",
                          "--workload", "trace", "--trace", trace, "--format", "json"))
        self.assertEqual(j["ok"], 6)
        # After the first, each request finds its first 1024 tokens (ids 7 and 8) cached.
        self.assertAlmostEqual(j["hit_rate"], 5 * 1024 / (6 * 1500), places=6)

    def test_kv_cache_tiers_load_what_the_pool_evicted(self):
        # A 1500-token prefix (ids 7, 8, 9) returns after five others have evicted it from a pool of
        # 100 blocks of 16 (1600 tokens): computed again without a tier, loaded from the store with
        # one (93 blocks of 16 tokens x 128 B = 190,464 B at 1 GB/s after 50 us).
        trace = os.path.join(WORKDIR, "tier_trace.jsonl")
        with open(trace, "w") as f:
            lines = [[7, 8, 9]] + [[100 + 3 * i, 101 + 3 * i, 102 + 3 * i] for i in range(5)] + [[7, 8, 9]]
            for i, ids in enumerate(lines):
                f.write(json.dumps({"timestamp": 1000 * i, "input_length": 1500, "output_length": 2,
                                    "hash_ids": ids}) + "\n")
        base = ["simulate", "--profile", self.profile, "--kv-blocks", "100", "--max-model-len", "1600", "--prefill", "0",
                "--decode", "1", "--workload", "trace", "--trace", trace, "--format", "json"]
        plain = json.loads(ok(*base))
        tiered = json.loads(ok(*base, "--kv-store-gib", "1", "--kv-store-gbps", "1", "--kv-store-latency-us", "50"))
        self.assertEqual((plain["ok"], tiered["ok"]), (7, 7))
        self.assertNotIn("store_loaded_tokens", plain)
        self.assertEqual(tiered["tier_loads"], 1)
        self.assertGreater(tiered["store_loaded_tokens"], 1000)
        self.assertGreater(tiered["hit_rate"], plain["hit_rate"])
        for args, what in ((["--kv-store-gib", "-1"], "--kv-store-gib"),
                           (["--kv-offload-disk-gib", "nan"], "--kv-offload-disk-gib"),
                           (["--kv-store-gib", "1", "--kv-store-gbps", "0"], "--kv-store-gbps"),
                           (["--kv-offload-disk-gib", "1e-9"], "smaller than one block")):
            r = pdserve(*base, *args)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(what, r.stderr)

    def test_plan_reports_every_split_and_the_best(self):
        out = json.loads(ok("plan", "--profile", self.profile, "--kv-blocks", "2048", "--workers", "3", "--slo-ttft-ms", "300",
                            "--slo-tpot-ms", "30", "--num-prompts", "60", "--input-len", "300",
                            "--output-len", "20", "--bisect-steps", "4", "--seeds", "1,2", "--format", "json"))
        self.assertEqual([p["seed"] for p in out], [1, 2])
        for p in out:
            self.assertEqual([(s["prefill"], s["decode"]) for s in p["splits"]], [(0, 3), (1, 2), (2, 1)])
            rates = [s["goodput"] for s in p["splits"]]
            self.assertEqual(rates[p["best"]], max(rates))
            self.assertTrue(all(r > 0 for r in rates), rates)
            self.assertTrue(all(s["attainment"] >= 0.9 for s in p["splits"]))
            f = p["formula"]
            self.assertEqual(f["prefill"] + f["decode"], 3)
            self.assertEqual(f["goodput"], p["splits"][f["prefill"]]["goodput"])
        for args, what in ((["--slo-ttft-ms", "0", "--slo-tpot-ms", "30"], "slo"),
                           (["--slo-ttft-ms", "100", "--slo-tpot-ms", "30", "--workers", "0"], "--workers"),
                           (["--slo-ttft-ms", "100", "--slo-tpot-ms", "30", "--policies", "best"], "best"),
                           (["--slo-ttft-ms", "100", "--slo-tpot-ms", "30", "--attainment", "2"], "--attainment")):
            r = pdserve("plan", "--profile", self.profile, *args)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(what, r.stderr)

    def test_bad_input_names_it(self):
        bad = os.path.join(WORKDIR, "bad_profile.json")
        write_json(bad, {**self.PROFILE, "step_cost": {"a_seconds": 0.01}})
        other = os.path.join(WORKDIR, "other_config.json")  # 4 layers: not the profile's 2.
        write_json(other, {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "vocab_size": 1000, "max_position_embeddings": 512})
        trace = os.path.join(WORKDIR, "bad_trace.jsonl")
        with open(trace, "w") as f:
            f.write('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": []}\n')
            f.write('{"timestamp": 5, "input_length": "ten", "output_length": 2, "hash_ids": []}\n')
        for args, what in ((["--profile", bad], "b_per_token"),
                           (["--profile", os.path.join(WORKDIR, "none.json")], "--profile"),
                           (["--profile", self.profile, "--decode", "0"], "decode workers"),
                           (["--profile", self.profile, "--policy", "fastest"], "fastest"),
                           (["--profile", self.profile, "--workload", "trace"], "--trace"),
                           (["--profile", self.profile, "--workload", "trace", "--trace", trace], "line 2"),
                           (["--profile", self.profile, "--request-rate", "-1"], "--request-rate"),
                           (["--profile", self.profile, "--model", other], "another model")):
            r = pdserve("simulate", *args)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(what, r.stderr)


class BoundsAndSignalsTest(unittest.TestCase):
    """Inputs nobody checked used to cost gigabytes or abort (plan --workers 1000 took 8.7 GB,
    simulate --prefill 100000 --decode 100000 10.8 GB, a trace line of 1e12 tokens std::bad_alloc);
    each is now refused by name at once, within a small memory bound, and requests longer than the
    model's context fail as the router fails them. Every command stops on SIGINT and SIGTERM."""

    def setUp(self):
        self.profile = os.path.join(WORKDIR, "bounds_profile.json")
        write_json(self.profile, {**SimulateTest.PROFILE,
                                  "model": {**SimulateTest.PROFILE["model"], "max_position_embeddings": 512}})

    def run_bounded(self, *args):
        """The command under a 1 GiB address-space limit (what it would allocate first fails)."""
        import resource

        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        return subprocess.run([PDSERVE, *args], capture_output=True, text=True, timeout=60, preexec_fn=limit)

    def test_absurd_counts_and_lengths_are_refused_by_name(self):
        trace = os.path.join(WORKDIR, "huge_trace.jsonl")
        with open(trace, "w") as f:
            f.write('{"timestamp": 0, "input_length": 1e12, "output_length": 2, "hash_ids": []}\n')
        wraps = os.path.join(WORKDIR, "wrap_trace.jsonl")
        with open(wraps, "w") as f:
            f.write('{"timestamp": 0, "input_length": 10, "output_length": 3e9, "hash_ids": []}\n')
        p = ["--profile", self.profile, "--kv-blocks", "2048"]
        for cmd, args, what in (
                ("plan", ["--workers", "1000", "--slo-ttft-ms", "100", "--slo-tpot-ms", "10"], "--workers"),
                ("plan", ["--workers", "2", "--slo-ttft-ms", "100", "--slo-tpot-ms", "10", "--start-rate", "1e300"],
                 "--start-rate"),
                ("simulate", ["--prefill", "100000", "--decode", "100000"], "workers"),
                ("simulate", ["--input-len", "1000000000"], "--input-len"),
                ("simulate", ["--num-prompts", "1000000000"], "--num-prompts"),
                ("simulate", ["--num-prompts", "1000000", "--input-len", "10000"], "--num-prompts x"),
                ("simulate", ["--workload", "trace", "--trace", trace], "line 1"),
                ("simulate", ["--workload", "trace", "--trace", wraps], "output_length"),
                ("simulate", ["--decode", "4", "--kv-blocks", "100000000"], "blocks to simulate")):
            args = p + args if "--kv-blocks" not in args else ["--profile", self.profile] + args
            r = self.run_bounded(cmd, *args)
            self.assertEqual(r.returncode, 2, f"{cmd} {args}: {r.stderr[-500:]}")
            self.assertIn(what, r.stderr)

    def test_requests_past_the_context_fail_as_the_router_fails_them(self):
        j = json.loads(ok("simulate", "--profile", self.profile, "--kv-blocks", "2048", "--num-prompts", "4",
                          "--input-len", "400", "--output-len", "200", "--format", "json"))
        self.assertEqual((j["ok"], j["failed"]), (0, 4))
        self.assertIn("exceed the context length of 512", j["first_error"])
        j = json.loads(ok("simulate", "--profile", self.profile, "--kv-blocks", "2048", "--num-prompts", "4",
                          "--input-len", "300", "--output-len", "200", "--format", "json"))
        self.assertEqual((j["ok"], j["failed"]), (4, 0))

    def test_every_command_stops_on_a_signal(self):
        import signal
        long_plan = ["plan", "--profile", self.profile, "--kv-blocks", "2048", "--workers", "64", "--slo-ttft-ms",
                     "100", "--slo-tpot-ms", "10", "--num-prompts", "5000"]
        long_sim = ["simulate", "--profile", self.profile, "--kv-blocks", "2048", "--decode", "64",
                    "--num-prompts", "2000000", "--input-len", "100", "--output-len", "100"]
        for args in (long_plan, long_sim):
            for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
                proc = subprocess.Popen([PDSERVE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                time.sleep(1.0)
                self.assertIsNone(proc.poll(), f"{args[0]} ended before the signal")
                proc.send_signal(sig)
                try:
                    self.assertEqual(proc.wait(timeout=10), code, args[0])
                except subprocess.TimeoutExpired:
                    proc.kill()
                    self.fail(f"{args[0]} ignored signal {sig}")
                self.assertIn("stopped by signal", proc.stderr.read())


class FlagCheckTest(unittest.TestCase):
    """Every flag is checked before a model loads: a bad one is exit 2 naming it. The model path
    does not exist, so a check that came after loading would fail on the model instead (exit 1)."""

    NO_MODEL = "/nonexistent/pdserve-model"

    def expect_usage(self, args, flag):
        p = pdserve(*args)
        self.assertEqual(p.returncode, 2, f"{args}: {p.stderr}")
        self.assertIn(flag, p.stderr, args)

    def test_serve_checks_every_flag_before_loading(self):
        serve = ["serve", "--model", self.NO_MODEL]
        self.expect_usage(serve + ["--http-listen", "127.0.0.1:-5"], "--http-listen")
        self.expect_usage(serve + ["--policy", "fastest"], "--policy")
        self.expect_usage(serve + ["--tool-call-parser", "mistral"], "--tool-call-parser")
        self.expect_usage(serve + ["--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"],
                          "--tls")
        self.expect_usage(serve + ["--api-key-file", "/nonexistent/keys"], "--api-key-file")
        self.expect_usage(serve + ["--lease-ms", "-5"], "--lease-ms")
        self.expect_usage(serve + ["--kv-send-timeout-ms", "0"], "--kv-send-timeout-ms")
        self.expect_usage(serve + ["--w-prefix", "nan"], "--w-prefix")
        self.expect_usage(serve + ["--imbalance-ratio", "inf"], "--imbalance-ratio")
        self.expect_usage(serve + ["--http-keep-alive-seconds", "0"], "--http-keep-alive-seconds")
        self.expect_usage(serve + ["--stream-interval", "0"], "--stream-interval")
        self.expect_usage(serve + ["--stream-interval", "5000"], "--stream-interval")
        self.expect_usage(["decode", "--model", self.NO_MODEL, "--transport", "carrier-pigeon"], "--transport")
        self.expect_usage(["prefill", "--model", self.NO_MODEL, "--kv-send-timeout-ms", "0"],
                          "--kv-send-timeout-ms")

    def test_router_takes_drain_seconds(self):
        router = ["router", "--model", self.NO_MODEL, "--decode", "127.0.0.1:1"]
        # The flag exists (an unknown flag says "unknown") and is checked.
        p = pdserve(*router, "--drain-seconds", "-1")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--drain-seconds: must be", p.stderr)
        self.expect_usage(router + ["--w-queue", "nan"], "--w-queue")

    def test_make_model_refuses_what_cannot_be_made_and_leaves_nothing(self):
        d = os.path.join(WORKDIR, "huge")
        p = pdserve("make-model", d, "--hidden", "100000", "--vocab", "100000")
        self.assertEqual(p.returncode, 2, p.stderr)  # Was an uncaught std::bad_alloc (134).
        self.assertIn("--hidden", p.stderr)
        self.assertFalse(os.path.exists(d))
        # In bounds, but more than this machine's memory: refused before anything is written.
        p = pdserve("make-model", d, "--hidden", "65536", "--intermediate", "262144", "--layers", "1024")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("GiB of memory", p.stderr)
        self.assertFalse(os.path.exists(d))

    def test_a_failed_write_leaves_no_partial_files(self):
        # A file size limit makes the weights' write fail midway (as a full disk would).
        import resource
        import signal
        d = os.path.join(WORKDIR, "limited")

        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

        p = subprocess.run([PDSERVE, "make-model", d, "--hidden", "256", "--intermediate", "512", "--layers", "4",
                            "--vocab", "512"], capture_output=True, text=True, preexec_fn=limit)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("write failed", p.stderr)
        self.assertFalse(os.path.exists(d), os.listdir(d) if os.path.exists(d) else None)
        # Into a directory that was there: its other files stay, ours (and any .tmp) go.
        os.makedirs(d)
        write_json(os.path.join(d, "notes.json"), {"keep": True})
        p = subprocess.run([PDSERVE, "make-model", d, "--hidden", "256", "--intermediate", "512", "--layers", "4",
                            "--vocab", "512"], capture_output=True, text=True, preexec_fn=limit)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(os.listdir(d), ["notes.json"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_cli_test_")
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
