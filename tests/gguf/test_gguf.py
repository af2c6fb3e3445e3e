"""pdserve's GGUF reader and block formats against llama.cpp's own gguf-py (pure Python over numpy,
fetched by scripts/gguf_py_setup.sh): files written by gguf-py are read by `pdserve gguf`, every
block type is dequantized by both and compared, pdserve's Q8_0 quantizer gives gguf-py's bytes,
files pdserve writes are read back by gguf-py, and broken files are refused with a message.

GgufModelTest runs whole GGUF models: `pdserve gguf convert` of a make-model checkpoint in f32
gives the same logits, bit for bit, as the checkpoint (and --weight-dtype q8_0 on the checkpoint
as its Q8_0 file); in Q8_0 (pdserve's quantizer) and with
every matrix in Q4_0, Q4_K, Q5_K or Q6_K blocks (gguf-py's writer), the engine's logits equal a
float64 numpy reference (tests/reference/hf_reference.py) run on the weights gguf-py dequantizes
from the same file, within 1e-4 of their range, for llama, qwen2 and qwen3 shapes.

Run: /usr/bin/python3 tests/gguf/test_gguf.py --pdserve build/pdserve
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import hf_reference  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import cluster  # noqa: E402
PDSERVE = None
WORKDIR = None
gguf = None

# (type, elements per block, bytes per block, offsets of f16 scales to make sane)
BLOCKS = {
    "Q8_0": (32, 34, [0]),
    "Q4_0": (32, 18, [0]),
    "Q5_0": (32, 22, [0]),
    "Q4_K": (256, 144, [0, 2]),
    "Q5_K": (256, 176, [0, 2]),
    "Q6_K": (256, 210, [208]),
}


GGUF_PY = None  # gguf-py's directory inside the fetched llama.cpp source.


def setup_gguf_py():
    global gguf, GGUF_PY
    path = subprocess.run([os.path.join(ROOT, "scripts", "gguf_py_setup.sh")], check=True,
                          capture_output=True, text=True).stdout.strip()
    GGUF_PY = path
    sys.path.insert(0, path)
    import gguf as module  # noqa: E402
    gguf = module


def run(*args, check=True):
    p = subprocess.run([PDSERVE, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"pdserve {' '.join(map(str, args))}: {p.stderr}")
    return p


def random_blocks(name, rows, cols, rng):
    """Random bytes are valid blocks once their f16 scales are finite and of a sane size."""
    qk, nbytes, scales = BLOCKS[name]
    raw = rng.integers(0, 256, size=(rows, cols // qk, nbytes), dtype=np.uint8)
    for at in scales:
        d = rng.uniform(0.001, 0.05, size=(rows, cols // qk)).astype(np.float16)
        raw[:, :, at:at + 2] = d.view(np.uint8).reshape(rows, cols // qk, 2)
    return raw.reshape(rows, cols // qk * nbytes)


class GgufPyTest(unittest.TestCase):
    def write(self, path, tensors, metadata=lambda w: None):
        w = gguf.GGUFWriter(path, "llama")
        metadata(w)
        for name, array, raw_dtype in tensors:
            w.add_tensor(name, array, raw_dtype=raw_dtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    def test_every_block_type_dequantizes_as_gguf_py_does(self):
        rng = np.random.default_rng(5)
        tensors, want = [], {}
        for name in BLOCKS:
            qtype = getattr(gguf.GGMLQuantizationType, name)
            raw = random_blocks(name, 3, 512, rng)
            tensors.append((f"w.{name}", raw, qtype))
            want[f"w.{name}"] = gguf.quants.dequantize(raw, qtype)
        f32 = rng.standard_normal((2, 64)).astype(np.float32)
        f16 = rng.standard_normal((2, 64)).astype(np.float16)
        tensors += [("w.F32", f32, None), ("w.F16", f16, None)]
        want["w.F32"], want["w.F16"] = f32, f16.astype(np.float32)
        bf16 = (rng.standard_normal((2, 64)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        tensors.append(("w.BF16", bf16.view(np.uint8), gguf.GGMLQuantizationType.BF16))
        want["w.BF16"] = (bf16.astype(np.uint32) << 16).view(np.float32)
        path = os.path.join(WORKDIR, "blocks.gguf")
        self.write(path, tensors)

        info = json.loads(run("gguf", "inspect", path).stdout)
        got_types = {t["name"]: (t["type"], t["dims"]) for t in info["tensors"]}
        for name in BLOCKS:
            self.assertEqual(got_types[f"w.{name}"], (name, [512, 3]))
        out = os.path.join(WORKDIR, "blocks")
        run("gguf", "dequantize", path, "--out", out)
        for name, expect in want.items():
            got = np.load(os.path.join(out, name + ".npy"))
            self.assertEqual(got.shape, expect.shape, name)
            if name in ("w.Q4_K", "w.Q5_K"):
                # pdserve subtracts the block's min inside one fused multiply-add; gguf-py rounds
                # the product first: at most an ulp of the product apart.
                tol = np.abs(expect).max() * 2.0 ** -22
                np.testing.assert_allclose(got, expect, rtol=0, atol=tol, err_msg=name)
            else:
                np.testing.assert_array_equal(got, expect, err_msg=name)

    def test_metadata_of_every_value_type(self):
        def metadata(w):
            w.add_uint8("u8", 200)
            w.add_int8("i8", -100)
            w.add_uint16("u16", 60000)
            w.add_int16("i16", -30000)
            w.add_uint32("u32", 4000000000)
            w.add_int32("i32", -2000000000)
            w.add_uint64("u64", 2 ** 63 + 5)
            w.add_int64("i64", -(2 ** 62))
            w.add_float32("f32", 0.5)
            w.add_float64("f64", -1.25e300)
            w.add_bool("yes", True)
            w.add_string("s", "héllo")
            w.add_array("tokens", ["<s>", "a", "é"])
            w.add_array("ints", [1, -2, 3])
            w.add_array("floats", [0.25, -4.0])
        path = os.path.join(WORKDIR, "meta.gguf")
        self.write(path, [("t", np.zeros((1, 32), dtype=np.float32), None)], metadata)
        meta = json.loads(run("gguf", "inspect", path).stdout)["metadata"]
        self.assertEqual(meta["general.architecture"], "llama")
        want = {"u8": 200, "i8": -100, "u16": 60000, "i16": -30000, "u32": 4000000000,
                "i32": -2000000000, "u64": 2 ** 63 + 5, "i64": -(2 ** 62), "f32": 0.5, "f64": -1.25e300,
                "yes": True, "s": "héllo", "tokens": ["<s>", "a", "é"], "ints": [1, -2, 3],
                "floats": [0.25, -4.0]}
        for k, v in want.items():
            self.assertEqual(meta[k], v, k)

    def test_q8_0_quantizer_gives_gguf_py_bytes_and_gguf_py_reads_our_files(self):
        rng = np.random.default_rng(9)
        src = rng.standard_normal((6, 256)).astype(np.float32)
        src[0, :32] = np.arange(-16, 16) * np.float32(0.5)  # Halfway cases: roundf's rule.
        src[1, :32] = 0.0                                   # d = 0.
        src[2, 5] = 1e-30                                   # A tiny scale.
        path = os.path.join(WORKDIR, "float.gguf")
        self.write(path, [("m", src, None), ("norm", np.ones((256,), dtype=np.float32), None)],
                   lambda w: w.add_string("note", "x"))
        out = os.path.join(WORKDIR, "q8.gguf")
        run("gguf", "quantize", path, out, "--type", "q8_0")
        reader = gguf.GGUFReader(out)
        by_name = {t.name: t for t in reader.tensors}
        self.assertEqual(by_name["m"].tensor_type, gguf.GGMLQuantizationType.Q8_0)
        self.assertEqual(by_name["norm"].tensor_type, gguf.GGMLQuantizationType.F32)  # 1-D: kept.
        want = gguf.quants.quantize(src, gguf.GGMLQuantizationType.Q8_0)
        self.assertEqual(np.asarray(by_name["m"].data).tobytes(), want.tobytes())
        self.assertEqual(bytes(reader.get_field("note").parts[-1]), b"x")
        self.assertEqual(list(by_name["m"].shape), [256, 6])

    def test_broken_files_are_refused_by_name(self):
        rng = np.random.default_rng(3)
        good = os.path.join(WORKDIR, "good.gguf")
        self.write(good, [("w", random_blocks("Q4_K", 2, 256, rng), gguf.GGMLQuantizationType.Q4_K)])
        with open(good, "rb") as f:
            data = f.read()

        def expect(name, blob, needle):
            p = os.path.join(WORKDIR, name)
            with open(p, "wb") as f:
                f.write(blob)
            r = run("gguf", "inspect", p, check=False)
            self.assertEqual(r.returncode, 1, name)
            self.assertIn(needle, r.stderr, name)
            self.assertNotIn("Traceback", r.stderr)

        expect("truncated.gguf", data[: len(data) // 2], "run past the end")
        expect("header.gguf", data[:20], "truncated")
        expect("magic.gguf", b"GGML" + data[4:], "wrong magic")
        expect("version.gguf", data[:4] + struct.pack("<I", 7) + data[8:], "version 7")
        expect("count.gguf", data[:8] + struct.pack("<Q", 2 ** 60) + data[16:], "tensors; at most")
        q2k = os.path.join(WORKDIR, "q2k.gguf")
        self.write(q2k, [("odd", rng.integers(0, 256, (2, 84), dtype=np.uint8), gguf.GGMLQuantizationType.Q2_K)])
        r = run("gguf", "inspect", q2k, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("tensor odd: type 10 is not supported", r.stderr)


class GgufMetadataBoundsTest(unittest.TestCase):
    """Metadata no loader reads is checked and skipped, not held (a 64 MB file of 8M empty strings
    cost 0.9 GB in `gguf inspect` and 1.8 GB in serve); gguf-py, an independent reader, says the
    files are valid GGUF and that `gguf quantize` copied the array whole."""

    N = 3 * 1024 * 1024  # Past the 2^21 elements a loader may hold.

    def raw(self, path, key, n):
        """A GGUF v3 file with no tensors and one array of n empty strings under `key`."""
        with open(path, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1))
            f.write(struct.pack("<Q", len(key)) + key.encode())
            f.write(struct.pack("<IIQ", 9, 8, n))  # array of strings
            f.write(b"\0" * (8 * n))

    def test_an_array_nobody_reads_costs_no_memory(self):
        # gguf-py (slow on millions of strings) checks a smaller one: a valid file, and the
        # array copied whole by `gguf quantize` though pdserve held 16 of its elements.
        small = os.path.join(WORKDIR, "junk_small.gguf")
        self.raw(small, "junk.strings", 100000)
        self.assertEqual(len(gguf.GGUFReader(small).get_field("junk.strings").data), 100000)
        copied = os.path.join(WORKDIR, "junk_copy.gguf")
        run("gguf", "quantize", small, copied, "--type", "q8_0")
        self.assertEqual(len(gguf.GGUFReader(copied).get_field("junk.strings").data), 100000)
        path = os.path.join(WORKDIR, "junk.gguf")
        self.raw(path, "junk.strings", self.N)
        # Its own peak, by GNU time (a child of Python would count Python's pages from the fork).
        r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kib=%M", PDSERVE, "gguf", "inspect", path],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(out["metadata"]["junk.strings"]["length"], self.N)
        maxrss_kib = int(r.stderr.rsplit("maxrss_kib=", 1)[1])
        # The 24 MB file is mapped; its 3M values held would be ~300 MB more.
        self.assertLess(maxrss_kib, 150 * 1024, "inspect held the array")
        # The same array where a loader reads it whole: refused by its bound, by name.
        tok = os.path.join(WORKDIR, "junk_tokens.gguf")
        self.raw(tok, "tokenizer.ggml.merges", self.N)
        r = run("gguf", "inspect", tok, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("tokenizer.ggml.merges: arrays of more than 2097152 elements", r.stderr)


# Scales of random blocks so that weights are ~0.05 in size (the engine's activations stay O(1)).
SCALE = {"Q8_0": 4e-4, "Q4_0": 8e-3, "Q5_0": 4e-3, "Q4_K": 6e-5, "Q5_K": 3e-5, "Q6_K": 1.5e-5}
PROMPT = [1, 17, 5, 203, 44, 9, 120, 3]
STEPS = 12


def hf_name(name):
    """llama.cpp's tensor name to Hugging Face's."""
    top = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
           "output_norm.weight": "model.norm.weight"}
    if name in top:
        return top[name]
    _, layer, rest = name.split(".", 2)
    parts = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
             "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
             "ffn_down.weight": "mlp.down_proj.weight"}
    for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
        parts[g + ".weight"] = f"self_attn.{h}.weight"
        parts[g + ".bias"] = f"self_attn.{h}.bias"
    return f"model.layers.{layer}.{parts[rest]}"


K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")


def reference_weights(path, cfg, llama):
    """HF-named float64 weights from a GGUF file, dequantized by gguf-py (a llama file's q and k
    rows put back in HF order, the inverse of llama.cpp's converter's permute), and the activation
    block of each quantized matrix (the engine's integer kernels quantize x per 32 elements for
    Q8_0/Q4_0/Q5_0, per 256 for the K-quants)."""
    weights, act_blocks = {}, {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name == "rope_freqs.weight":
            continue
        shape = [int(d) for d in reversed(t.shape)]
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float64)
        name = hf_name(t.name)
        qname = t.tensor_type.name
        if qname not in ("F32", "F16", "BF16"):
            act_blocks[name] = 256 if qname in K_QUANTS else 32
        if llama and (".q_proj." in name or ".k_proj." in name):
            heads = cfg.heads if ".q_proj." in name else cfg.kv_heads
            rows = values.shape[0]
            values = (values.reshape(heads, cfg.head_dim // 2, 2, *values.shape[1:]).swapaxes(1, 2)
                      .reshape(rows, *values.shape[1:]))
        weights[name] = values
    if "lm_head.weight" not in weights:  # Tied: the embedding matrix is the head's.
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        if "model.embed_tokens.weight" in act_blocks:
            act_blocks["lm_head.weight"] = act_blocks["model.embed_tokens.weight"]
    return weights, act_blocks


def engine_logits(model, extra=()):
    dump = model + f".{len(extra)}.npy"
    out = json.loads(run("generate", "--model", model, "--prompt-ids", ",".join(map(str, PROMPT)),
                         "--max-tokens", STEPS, "--temperature", 0, "--ignore-eos", "--format", "json",
                         "--threads", 2, "--kv-memory-gib", 0.05, "--compute-dtype", "f32",
                         "--dump-logits", dump, *extra).stdout)
    return out["token_ids"], np.load(dump).astype(np.float64)


class GgufModelTest(unittest.TestCase):
    def make(self, arch):
        hf = os.path.join(WORKDIR, f"hf_{arch}")
        if not os.path.exists(hf):
            run("make-model", hf, "--arch", arch, "--layers", 2, "--hidden", 256, "--heads", 4,
                "--kv-heads", 2, "--intermediate", 512, "--vocab", 320, "--seed", 11)
        return hf

    def with_random_blocks(self, f32_path, out, qname):
        """The f32 file with every matrix whose rows are whole 256-element blocks replaced by random
        blocks of `qname` (gguf-py's writer; the metadata copied field by field)."""
        reader = gguf.GGUFReader(f32_path)
        arch = bytes(reader.get_field("general.architecture").parts[-1]).decode()
        w = gguf.GGUFWriter(out, arch)
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name == "general.architecture":
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(field.name, field.contents(), vtype, sub)
        rng = np.random.default_rng(21)
        qtype = getattr(gguf.GGMLQuantizationType, qname)
        for t in reader.tensors:
            data = np.asarray(t.data)
            shape = [int(d) for d in reversed(t.shape)]
            if len(shape) == 2 and shape[1] % 256 == 0:
                raw = random_blocks(qname, shape[0], shape[1], rng)
                qk, nbytes, scales = BLOCKS[qname]
                blocks = raw.reshape(shape[0], -1, nbytes)
                for at in scales:
                    d = (rng.uniform(0.5, 1.0, size=blocks.shape[:2]) * SCALE[qname]).astype(np.float16)
                    blocks[:, :, at:at + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
                w.add_tensor(t.name, blocks.reshape(shape[0], -1), raw_dtype=qtype)
            else:
                w.add_tensor(t.name, data.reshape(shape).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    def check_parity(self, name, path, hf_dir, llama):
        tokens, logits = engine_logits(path)
        cfg = hf_reference.Config(hf_dir)
        weights, act_blocks = reference_weights(path, cfg, llama)
        ties = []
        ref = hf_reference.forward(cfg, weights, PROMPT + tokens[:-1], act_blocks=act_blocks, ties=ties)
        ref = ref[len(PROMPT) - 1:]
        scale = np.max(np.abs(ref), axis=-1)

        def error(r):
            return np.max(np.abs(logits - r), axis=-1) / scale

        # The kernels quantize activations to int8: an activation within a hair of a rounding
        # boundary (a tie candidate) may round the other way in the engine's float32, and on
        # these small random models one such code can move the logits by ~1e-2. Where a step is
        # off by more than 1e-4, the engine's choices are found: candidates in the order the
        # layers run, each flipped and kept if that brings the reference closer to the engine
        # by squared distance (the candidates after it then taken from the flipped pass, whose
        # later activations moved). The reference with those flips must then be within 1e-4
        # everywhere: wrong arithmetic is not explained by a few codes rounded the other way.
        err, flips = error(ref), []
        candidates = sorted(ties)
        while np.any(err > 1e-4) and candidates:
            tie = candidates.pop(0)
            trial_ties = []
            trial = hf_reference.forward(cfg, weights, PROMPT + tokens[:-1], act_blocks=act_blocks,
                                         ties=trial_ties, flips=flips + [tie])[len(PROMPT) - 1:]
            # A flip the engine made removes its own perturbation, one it did not adds another.
            if np.sum((logits - trial) ** 2) < np.sum((logits - ref) ** 2):
                flips, ref, err = flips + [tie], trial, error(trial)
                candidates = sorted(t for t in trial_ties if t > tie)
        for step in range(STEPS):
            self.assertLessEqual(err[step], 1e-4, f"{name}: step {step} relative error {err[step]:.3g} "
                                 f"({len(ties)} tie candidates, {len(flips)} flipped)")
            self.assertEqual(int(np.argmax(ref[step])), tokens[step], f"{name}: step {step}")
        worst = float(np.max(err))
        # The same file in chunks of 3 tokens and batched with itself: the same bits.
        _, chunked = engine_logits(path, ("--max-num-batched-tokens", "3"))
        np.testing.assert_array_equal(chunked, logits, err_msg=f"{name}: chunked prefill")
        print(f"  {name:14s} max relative error {worst:.2e} ({len(ties)} tie candidates, "
              f"{len(flips)} rounded the other way by the engine)", file=sys.stderr)

    def test_f32_conversion_equals_the_checkpoint_bitwise(self):
        for arch in ("llama", "qwen2", "qwen3"):
            hf = self.make(arch)
            f32 = os.path.join(WORKDIR, f"{arch}_f32.gguf")
            run("gguf", "convert", hf, f32, "--type", "f32")
            tokens_hf, logits_hf = engine_logits(hf)
            tokens_gguf, logits_gguf = engine_logits(f32)
            self.assertEqual(tokens_gguf, tokens_hf, arch)
            np.testing.assert_array_equal(logits_gguf, logits_hf, err_msg=arch)

    def test_k_quant_bytes_equal_llama_cpps_reference_quantizer(self):
        """Q4_K, Q6_K and Q8_0 blocks of `gguf convert --type q4_k_m` against llama.cpp's own C
        reference quantizers (quantize_row_*_ref in ggml-quants.c, the source gguf_py_setup.sh
        fetched, compiled here), given the f32 file's values: the same bytes, block for block."""
        import ctypes
        src = os.path.join(os.path.dirname(GGUF_PY), "ggml")
        lib = os.path.join(WORKDIR, "libggml_quants_ref.so")
        stubs = os.path.join(WORKDIR, "ggml_stubs.c")
        with open(stubs, "w") as f:  # ggml-quants.c's references into the rest of ggml; unused here.
            f.write("#include <stdlib.h>\n#include <stddef.h>\n"
                    "void ggml_abort(const char* f, int l, const char* m, ...) { abort(); }\n"
                    "size_t ggml_row_size(int t, long long n) { abort(); }\n"
                    "const char* ggml_type_name(int t) { return \"?\"; }\n"
                    "size_t ggml_type_size(int t) { abort(); }\n")
        subprocess.run(["cc", "-O2", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", f"-I{src}/include", f"-I{src}/src", f"-I{src}/src/ggml-cpu",
                        f"{src}/src/ggml-quants.c", stubs, "-o", lib, "-lm"], check=True, capture_output=True)
        ref = ctypes.CDLL(lib)
        quantizers = {"Q4_K": (ref.quantize_row_q4_K_ref, 256, 144), "Q6_K": (ref.quantize_row_q6_K_ref, 256, 210),
                      "Q8_0": (ref.quantize_row_q8_0_ref, 32, 34)}
        hf = self.make("llama")
        f32, q = os.path.join(WORKDIR, "llama_ref_f32.gguf"), os.path.join(WORKDIR, "llama_ref_q4_k_m.gguf")
        run("gguf", "convert", hf, f32, "--type", "f32")
        run("gguf", "convert", hf, q, "--type", "q4_k_m")
        source = {t.name: np.asarray(t.data, dtype=np.float32) for t in gguf.GGUFReader(f32).tensors}
        checked = {}
        for t in gguf.GGUFReader(q).tensors:
            qname = t.tensor_type.name
            if qname not in quantizers:
                continue
            fn, qk, nbytes = quantizers[qname]
            x = np.ascontiguousarray(source[t.name].reshape(-1))
            want = np.zeros(x.size // qk * nbytes, dtype=np.uint8)
            fn(x.ctypes.data_as(ctypes.c_void_p), want.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
            got = np.asarray(t.data).reshape(-1).view(np.uint8)
            self.assertEqual(got.size, want.size, t.name)
            diff = np.nonzero(got != want)[0]
            self.assertEqual(diff.size, 0, f"{t.name} ({qname}): {diff.size} bytes differ, first at {diff[:1]}")
            checked[qname] = checked.get(qname, 0) + 1
        self.assertEqual(set(checked), {"Q4_K", "Q6_K"}, checked)  # Q4_K_M's mix: both formats.

    def test_q4_k_m_of_rows_that_are_not_whole_256_blocks(self):
        """Rows of 160 (as Qwen2.5-0.5B's 896): llama-quantize's fallbacks, Q4_K to Q5_0 and Q6_K
        to Q8_0, with gguf-py's bytes for the same f32 values; the file equal to the reference,
        and to the checkpoint quantized on load."""
        hf = os.path.join(WORKDIR, "hf_rows160")
        run("make-model", hf, "--arch", "llama", "--layers", 2, "--hidden", 160, "--heads", 2,
            "--kv-heads", 1, "--intermediate", 320, "--vocab", 320, "--seed", 13)
        f32, q4km = (os.path.join(WORKDIR, f"rows160_{t}.gguf") for t in ("f32", "q4_k_m"))
        run("gguf", "convert", hf, f32, "--type", "f32")
        run("gguf", "convert", hf, q4km, "--type", "q4_k_m")
        values = {t.name: np.asarray(t.data, dtype=np.float32) for t in gguf.GGUFReader(f32).tensors}
        got = {t.name: t for t in gguf.GGUFReader(q4km).tensors}
        want_types = {"blk.0.attn_q.weight": "Q5_0", "blk.0.ffn_gate.weight": "Q5_0",
                      "blk.0.ffn_down.weight": "Q5_0", "blk.1.ffn_down.weight": "Q8_0",
                      "blk.1.attn_v.weight": "Q8_0", "output.weight": "Q8_0"}
        for name, qname in want_types.items():
            t = got[name]
            self.assertEqual(t.tensor_type.name, qname, name)
            want = gguf.quants.quantize(values[name], t.tensor_type)
            self.assertEqual(np.asarray(t.data).tobytes(), want.tobytes(), name)
        self.check_parity("llama_rows160_Q4_K_M", q4km, hf, True)
        tokens_file, logits_file = engine_logits(q4km)
        tokens_load, logits_load = engine_logits(hf, ("--weight-dtype", "q4_k_m"))
        self.assertEqual(tokens_load, tokens_file)
        np.testing.assert_array_equal(logits_load, logits_file)

    def test_sentencepiece_vocabulary_serves_text(self):
        """A Llama 2-style file (SentencePiece pieces, scores and piece types in tokenizer.ggml.*,
        model "llama", as TinyLlama's and Mistral's GGUF files carry them): text in and text out
        equal to the checkpoint read with Llama 2's tokenizer.json (whose tokenizer the oracle
        test holds to the npm oracle)."""
        node_modules = subprocess.run([os.path.join(ROOT, "scripts", "oracle_setup.sh")], check=True,
                                      capture_output=True, text=True).stdout.strip()
        tokdir = os.path.join(node_modules, "@lenml", "tokenizer-llama2", "models")
        hf = os.path.join(WORKDIR, "hf_sentencepiece")
        run("make-model", hf, "--arch", "llama", "--layers", 1, "--hidden", 64, "--heads", 2,
            "--kv-heads", 1, "--intermediate", 128, "--vocab", 32000, "--seed", 5)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokdir, name), os.path.join(hf, name))
        with open(os.path.join(hf, "config.json")) as f:
            config = json.load(f)
        config.update(bos_token_id=1, eos_token_id=2)  # Llama 2's <s> and </s>.
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump(config, f)
        path = os.path.join(WORKDIR, "sentencepiece.gguf")
        run("gguf", "convert", hf, path, "--type", "f32")
        reader = gguf.GGUFReader(path)
        self.assertEqual(bytes(reader.get_field("tokenizer.ggml.model").parts[-1]).decode(), "llama")
        self.assertEqual(len(reader.get_field("tokenizer.ggml.scores").data), 32000)
        self.assertIsNone(reader.get_field("tokenizer.ggml.merges"))
        for prompt in ("The quick brown fox", "\u00dcn\u00efc\u00f6d\u00e9 \u4e2d\u6587 <s> test\n\tend"):
            outputs = [json.loads(run("generate", "--model", m, "--prompt", prompt, "--max-tokens", 12,
                                      "--temperature", 0, "--ignore-eos", "--format", "json",
                                      "--compute-dtype", "f32").stdout) for m in (hf, path)]
            for key in ("token_ids", "text", "usage"):
                self.assertEqual(outputs[1][key], outputs[0][key], f"{prompt!r}: {key}")

    def test_quantized_models_equal_the_float64_reference(self):
        for arch in ("llama", "qwen2", "qwen3"):
            hf = self.make(arch)
            # pdserve's quantizers: each file against the reference, and the checkpoint quantized on
            # load (--weight-dtype) the same model as the file, bit for bit.
            for qtype, label in (("q8_0", "Q8_0"), ("q4_k", "Q4_K(ours)"), ("q4_k_m", "Q4_K_M(ours)")):
                path = os.path.join(WORKDIR, f"{arch}_{qtype}.gguf")
                run("gguf", "convert", hf, path, "--type", qtype)
                if qtype == "q4_k_m":  # llama-quantize's mix: the head and layer 1's attn_v, ffn_down.
                    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
                    head = "output.weight" if "output.weight" in types else "token_embd.weight"
                    self.assertEqual(types[head], "Q6_K", arch)
                    self.assertEqual((types["blk.0.attn_v.weight"], types["blk.1.attn_v.weight"]),
                                     ("Q4_K", "Q6_K"), arch)
                    self.assertEqual((types["blk.0.ffn_down.weight"], types["blk.1.ffn_down.weight"]),
                                     ("Q4_K", "Q6_K"), arch)
                    self.assertEqual(types["blk.0.attn_q.weight"], "Q4_K", arch)
                    # kv-calc's Q4_K_M estimate for the checkpoint is the file's tensors (but the
                    # few rope factors a llama 3 file adds).
                    estimate = json.loads(run("kv-calc", "--model", hf, "--format", "json").stdout)
                    actual = json.loads(run("kv-calc", "--model", path, "--format", "json").stdout)
                    self.assertAlmostEqual(estimate["weight_bytes"]["q4_k_m"],
                                           actual["weight_bytes_of_file"], delta=512, msg=arch)
                self.check_parity(f"{arch}_{label}", path, hf, arch == "llama")
                if qtype == "q4_k_m":
                    # A GGUF file's blocks converted to f32 on load (--weight-dtype f32): the
                    # dequantized weights with f32 activations, equal to the reference without
                    # activation quantization.
                    tokens_f32, logits_f32 = engine_logits(path, ("--weight-dtype", "f32"))
                    cfg = hf_reference.Config(hf)
                    weights, _ = reference_weights(path, cfg, arch == "llama")
                    ref = hf_reference.forward(cfg, weights, PROMPT + tokens_f32[:-1])[len(PROMPT) - 1:]
                    err = np.max(np.abs(logits_f32 - ref), axis=-1) / np.max(np.abs(ref), axis=-1)
                    self.assertLessEqual(float(np.max(err)), 1e-4, f"{arch}: q4_k_m as f32")
                tokens_file, logits_file = engine_logits(path)
                tokens_load, logits_load = engine_logits(hf, ("--weight-dtype", qtype))
                self.assertEqual(tokens_load, tokens_file, arch)
                np.testing.assert_array_equal(logits_load, logits_file, err_msg=f"{arch}: on-load {qtype}")
            f32 = os.path.join(WORKDIR, f"{arch}_f32.gguf")
            run("gguf", "convert", hf, f32, "--type", "f32")
            for qname in ("Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"):
                path = os.path.join(WORKDIR, f"{arch}_{qname}.gguf")
                self.with_random_blocks(f32, path, qname)
                self.check_parity(f"{arch}_{qname}", path, hf, arch == "llama")


class GgufTiersTest(unittest.TestCase):
    """A GGUF file through every tier: serve's gRPC and OpenAI APIs on its own tokenizer, equal to
    `generate` on the file; and tiers on different files of one model (prefill on the f32
    checkpoint, decode on its Q8_0 GGUF): they pair, pages move, and the router names the mixed
    numerics."""

    def test_serve_and_mixed_tiers(self):
        cluster.stubs_dir()
        import grpc
        from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg
        from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc
        hf = os.path.join(WORKDIR, "tiers_hf")
        run("make-model", hf, "--arch", "llama", "--layers", 2, "--hidden", 128, "--heads", 4,
            "--kv-heads", 2, "--intermediate", 256, "--vocab", 512, "--seed", 4)
        q8 = os.path.join(WORKDIR, "tiers_q8.gguf")
        run("gguf", "convert", hf, q8, "--type", "q8_0")
        text = "In the beginning was the word"
        want = json.loads(run("generate", "--model", q8, "--prompt", text, "--max-tokens", 8,
                              "--temperature", 0, "--ignore-eos", "--format", "json",
                              "--compute-dtype", "f32").stdout)
        s = cluster.Process(PDSERVE, ["serve", "--model", q8, "--listen", "127.0.0.1:0", "--threads", "1",
                                      "--kv-memory-gib", "0.05", "--http-listen", "127.0.0.1:0",
                                      "--compute-dtype", "f32"])
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(s.grpc))
            ids = []
            for r in stub.Generate(pb.GenerateRequest(text=text, sampling=pb.SamplingParams(
                    max_tokens=8, temperature=0, ignore_eos=True)), timeout=60):
                ids += list(r.token_ids)
            self.assertEqual(ids, want["token_ids"])
            import urllib.request
            req = urllib.request.Request(f"http://{s.addresses['http']}/v1/completions", data=json.dumps(
                {"prompt": text, "max_tokens": 8, "temperature": 0, "ignore_eos": True}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                got = json.loads(r.read())
            self.assertEqual(got["choices"][0]["text"], want["text"])
            self.assertEqual(got["model"], "tiers_q8.gguf")
        finally:
            self.assertEqual(s.stop(), 0)

        engine = ["--transport", "tcp", "--threads", "1", "--kv-memory-gib", "0.05", "--compute-dtype", "f32"]
        p = cluster.Process(PDSERVE, ["prefill", "--listen", "127.0.0.1:0", "--model", hf, *engine])
        d = cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", q8, "--transport", "tcp",
                                      "--local-prefill-tokens", "4", "--threads", "1", "--kv-memory-gib", "0.05",
                                      "--compute-dtype", "f32", "--metrics-listen", "127.0.0.1:0"])
        router = cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", q8,
                                           "--prefill", p.grpc, "--decode", d.grpc,
                                           "--local-prefill-tokens", "4"])
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(router.grpc))
            out = list(stub.Generate(pb.GenerateRequest(text=text + " and the word was", sampling=pb.SamplingParams(
                max_tokens=6, temperature=0, ignore_eos=True)), timeout=60))
            self.assertEqual(out[-1].finish_reason, "length")
            self.assertEqual(sum(len(r.token_ids) for r in out), 6)
            admin = worker_pb2_grpc.RouterAdminStub(grpc.insecure_channel(router.grpc))
            stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
            self.assertEqual(stats.decode[0].info.numerics, "f32+Q8_0")
            self.assertEqual(cluster.worker_info(p.grpc, prefill=True).numerics, "f32")
            self.assertEqual(stats.mixed_numerics_workers, 1, stats)
            self.assertEqual(cluster.metric(d, "pdserve_numerics_info", role="decode", numerics="f32+Q8_0"), 1)
            self.assertEqual(cluster.worker_info(d.grpc, prefill=False).transfers_completed, 1)  # Pages moved.
        finally:
            codes = [router.stop(), d.stop(), p.stop()]
            self.assertEqual(codes, [0, 0, 0])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_gguf_")
    setup_gguf_py()
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
