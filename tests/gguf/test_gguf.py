"""pdserve's GGUF reader and block formats against llama.cpp's own gguf-py (pure Python over numpy,
fetched by scripts/gguf_py_setup.sh): files written by gguf-py are read by `pdserve gguf`, every
block type is dequantized by both and compared, pdserve's Q8_0 quantizer gives gguf-py's bytes,
files pdserve writes are read back by gguf-py, and broken files are refused with a message.

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
PDSERVE = None
WORKDIR = None
gguf = None

# (type, elements per block, bytes per block, offsets of f16 scales to make sane)
BLOCKS = {
    "Q8_0": (32, 34, [0]),
    "Q4_0": (32, 18, [0]),
    "Q4_K": (256, 144, [0, 2]),
    "Q5_K": (256, 176, [0, 2]),
    "Q6_K": (256, 210, [208]),
}


def setup_gguf_py():
    global gguf
    path = subprocess.run([os.path.join(ROOT, "scripts", "gguf_py_setup.sh")], check=True,
                          capture_output=True, text=True).stdout.strip()
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
