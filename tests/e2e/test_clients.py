"""The example clients (Python and Node.js) stream a generation through `pdserve serve` and get the
tokens `pdserve generate` produces locally; `pdserve generate --server` does too.

Run: /usr/bin/python3 tests/e2e/test_clients.py --pdserve build/pdserve
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

ROOT = cluster.ROOT
PDSERVE = None
MODEL = None
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"


class ClientsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.want = json.loads(subprocess.run(
            [PDSERVE, "generate", "--model", MODEL, "--prompt", PROMPT, "--max-tokens", "20",
             "--temperature", "0", "--format", "json", "--kv-memory-gib", "0.05"],
            capture_output=True, text=True, check=True).stdout)
        cls.serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0",
                                              "--threads", "1", "--kv-memory-gib", "0.05"])

    @classmethod
    def tearDownClass(cls):
        cls.serve.stop()

    def check(self, got):
        self.assertEqual(got["token_ids"], self.want["token_ids"])
        self.assertEqual(got["text"], self.want["text"])
        self.assertEqual(got["finish_reason"], self.want["finish_reason"])

    def test_python_example(self):
        env = dict(os.environ, PDSERVE_PYTHON_STUBS=tempfile.mkdtemp(prefix="pdserve_pystubs_"))
        out = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/python/generate.py"),
                              "--server", self.serve.grpc, "--prompt", PROMPT, "--max-tokens", "20",
                              "--json"], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.check(json.loads(out.stdout))

    def test_node_example(self):
        modules = subprocess.run([os.path.join(ROOT, "scripts/node_example_setup.sh")], check=True,
                                 capture_output=True, text=True).stdout.strip()
        env = dict(os.environ, NODE_PATH=modules)
        out = subprocess.run(["node", os.path.join(ROOT, "examples/node/generate.js"), "--server",
                              self.serve.grpc, "--prompt", PROMPT, "--max-tokens", "20", "--json"],
                             capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.check(json.loads(out.stdout))

    def test_generate_server_flag(self):
        out = json.loads(subprocess.run(
            [PDSERVE, "generate", "--server", self.serve.grpc, "--prompt", PROMPT, "--max-tokens", "20",
             "--temperature", "0", "--format", "json"], capture_output=True, text=True, check=True).stdout)
        self.check(out)
        self.assertEqual(out["logprobs"], self.want["logprobs"])

    def test_stop_string_matches_local(self):
        # A stop string taken from the middle of the greedy text: both paths cut there.
        text = self.want["text"]
        stop = text[len(text) // 2: len(text) // 2 + 3]
        if not stop.strip():
            self.skipTest("the random model's text has no usable stop string")
        args = ["--prompt", PROMPT, "--max-tokens", "20", "--temperature", "0", "--format", "json",
                "--stop", stop]
        local = json.loads(subprocess.run([PDSERVE, "generate", "--model", MODEL, "--kv-memory-gib", "0.05",
                                           *args], capture_output=True, text=True, check=True).stdout)
        served = json.loads(subprocess.run([PDSERVE, "generate", "--server", self.serve.grpc, *args],
                                           capture_output=True, text=True, check=True).stdout)
        self.assertEqual(local["finish_reason"], "stop")
        self.assertEqual(served["finish_reason"], "stop")
        self.assertEqual(served["text"], local["text"])
        self.assertEqual(served["text"], text[:text.find(stop)])

    def test_health_and_reflection(self):
        # Raw bytes, so the test needs neither the health nor the reflection Python packages.
        import grpc
        channel = grpc.insecure_channel(self.serve.grpc)
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b, response_deserializer=lambda b: b)
        self.assertEqual(check(b"", timeout=10), b"\x08\x01")  # status: SERVING
        reflect = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                        request_serializer=lambda b: b, response_deserializer=lambda b: b)
        replies = list(reflect(iter([b"\x3a\x00"]), timeout=10))  # list_services: ""
        self.assertTrue(any(b"pdserve.v1.Generation" in r for r in replies))

    def test_deadline_reaches_the_tiers(self):
        out = subprocess.run([PDSERVE, "generate", "--server", self.serve.grpc, "--prompt", PROMPT,
                              "--max-tokens", "3000", "--ignore-eos", "--timeout-seconds", "0.3"],
                             capture_output=True, text=True)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("eadline", out.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    workdir = tempfile.mkdtemp(prefix="pdserve_clients_")
    MODEL = os.path.join(workdir, "model")
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "qwen2", "--layers", "2", "--vocab", "768",
                    "--max-position", "4096", "--seed", "5"], check=True, capture_output=True)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
