"""KV cache tiers on real processes (issue 59, the disk tier): `serve --kv-offload-disk DIR` keeps
the prefix blocks it publishes in DIR; a second `serve` on the same directory (a restarted worker:
an empty pool) loads them instead of computing them, and its outputs (ids and logprobs, greedy and
seeded, prompts prefilled on the decode worker and on the prefill worker) equal the first run's
bit for bit. The tier's metrics say what moved. A directory that cannot be used is refused by name.

Run: /usr/bin/python3 tests/e2e/test_kv_tiers.py --pdserve build/pdserve
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402

PDSERVE = None
WORKDIR = None
MODEL = None


def serve(tier, *extra):
    return cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                     "--block-size", "4", "--kv-blocks", "48", "--local-prefill-tokens", "24",
                                     "--metrics-listen", "127.0.0.1:0", "--kv-offload-disk", tier,
                                     "--kv-offload-disk-gib", "0.5", *extra])


def requests():
    """Prompts over four shared prefixes (some prefilled on the decode worker, some long enough
    for the prefill worker), greedy and seeded, more blocks in all than the 48-block pools hold."""
    rng = random.Random(17)
    prefixes = [[rng.randrange(3, 500) for _ in range(rng.choice((12, 40)))] for _ in range(4)]
    out = []
    for i in range(16):
        ids = prefixes[i % 4] + [rng.randrange(3, 500) for _ in range(rng.randrange(2, 9))]
        sp = pb.SamplingParams(max_tokens=5, temperature=0 if i % 2 == 0 else 0.9, seed=100 + i, logprobs=1,
                               ignore_eos=True)
        out.append(pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sp))
    return out


def run(process):
    stub = pbg.GenerationStub(grpc.insecure_channel(process.grpc))
    got = []
    for req in requests():
        ids, lps = [], []
        for r in stub.Generate(req, timeout=120):
            ids += list(r.token_ids)
            lps += list(r.logprobs)
        got.append((ids, lps))
    return got


def tier_metric(process, name, role):
    return cluster.metric(process, name, role=role, tier="disk")


def wait_stored(process):
    """Until the tier's stores have stopped growing (they run on an I/O thread after each step)."""
    last, deadline = -1, time.time() + 30
    while time.time() < deadline:
        now = sum(tier_metric(process, "pdserve_kv_offload_store_bytes_total", r) for r in ("prefill", "decode"))
        if now == last and now > 0:
            return now
        last = now
        time.sleep(0.5)
    raise AssertionError("the tier's stores did not settle")


class KvTiersTest(unittest.TestCase):
    def test_a_restarted_serve_loads_its_prefixes_from_disk_with_the_same_outputs(self):
        tier = os.path.join(WORKDIR, "tier")
        first = serve(tier)
        try:
            want = run(first)
            stored = wait_stored(first)
            self.assertGreater(stored, 0)
        finally:
            self.assertEqual(first.stop(), 0)
        self.assertTrue(any(f.endswith(".kvb") for f in os.listdir(tier)))
        second = serve(tier)
        try:
            got = run(second)
            self.assertEqual(got, want, "outputs with prefixes from the tier differ from computing them")
            loaded = sum(tier_metric(second, "pdserve_kv_offload_loaded_blocks_total", r) for r in ("prefill", "decode"))
            self.assertGreater(loaded, 0)
            # Both paths: prompts prefilled on the decode worker, and on the prefill worker.
            self.assertGreater(tier_metric(second, "pdserve_kv_offload_loaded_tokens_total", "decode"), 0)
            self.assertGreater(tier_metric(second, "pdserve_kv_offload_loaded_tokens_total", "prefill"), 0)
            self.assertEqual(sum(tier_metric(second, "pdserve_kv_offload_corrupt_blocks_total", r)
                                 for r in ("prefill", "decode")), 0)
        finally:
            self.assertEqual(second.stop(), 0)

    def test_an_unusable_directory_is_refused_by_name(self):
        blocker = os.path.join(WORKDIR, "a_file")
        with open(blocker, "w") as f:
            f.write("x")
        for args, what in ((["--kv-offload-disk", os.path.join(blocker, "tier")], "--kv-offload-disk: cannot make"),
                           (["--kv-offload-disk", blocker], "is not a directory"),
                           (["--kv-offload-disk", os.path.join(WORKDIR, "t2"), "--kv-offload-disk-gib", "0"],
                            "--kv-offload-disk-gib")):
            r = subprocess.run([PDSERVE, "serve", "--model", MODEL, "--listen", "127.0.0.1:0", *args],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(what, r.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_kv_tiers_")
    MODEL = os.path.join(WORKDIR, "model")
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "llama", "--layers", "2", "--hidden", "64",
                    "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--seed", "3"],
                   check=True, capture_output=True)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
