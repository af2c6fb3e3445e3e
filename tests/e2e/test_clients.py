"""The example clients (Python and Node.js) stream a generation through `pdserve serve` and get the
tokens `pdserve generate` produces locally; `pdserve generate --server` does too.

Run: /usr/bin/python3 tests/e2e/test_clients.py --pdserve build/pdserve
"""

import argparse
import concurrent.futures
import json
import os
import random
import struct
import shutil
import subprocess
import sys
import tempfile
import time
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
        # The server's own error reaches the user by name.
        bad = subprocess.run([PDSERVE, "generate", "--server", self.serve.grpc, "--prompt-ids", "99999"],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("id 99999 at position 0 is outside the vocabulary", bad.stderr)

    def test_stop_string_matches_local(self):
        # A stop string taken from the middle of the greedy text (the first three characters from
        # there that are not all blank): both paths cut there. The model and prompt are fixed, so
        # the text is too; a text without one is a failure to look at, not a skip.
        text = self.want["text"]
        starts = [i for i in range(len(text) // 2, len(text) - 2) if text[i:i + 3].strip()]
        self.assertTrue(starts, f"no usable stop string in the greedy text {text!r}")
        stop = text[starts[0]:starts[0] + 3]
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
        """A deadline that ends a running generation: the client gets DEADLINE_EXCEEDED, and the
        server side frees the request (the decode worker counts an abort and holds no block).
        A wider model than the other tests' (about 1 ms a token here), so 4,000 tokens cannot
        finish inside the 0.3 s deadline even on a machine many times faster."""
        model = os.path.join(os.path.dirname(MODEL), "wide")
        if not os.path.exists(model):
            subprocess.run([PDSERVE, "make-model", model, "--layers", "4", "--hidden", "256", "--heads", "4",
                            "--kv-heads", "2", "--vocab", "768", "--max-position", "8192"],
                           check=True, capture_output=True)
        serve = cluster.Process(PDSERVE, ["serve", "--model", model, "--listen", "127.0.0.1:0", "--threads", "1",
                                          "--kv-memory-gib", "0.05", "--metrics-listen", "127.0.0.1:0"])
        try:
            out = subprocess.run([PDSERVE, "generate", "--server", serve.grpc, "--prompt", PROMPT,
                                  "--max-tokens", "4000", "--ignore-eos", "--timeout-seconds", "0.3"],
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 1)
            self.assertIn("Deadline Exceeded", out.stderr)
            deadline = time.time() + 20
            while True:
                aborted = cluster.metric(serve, "pdserve_request_success_total", role="decode", finished_reason="abort")
                # The router ends it on its own deadline (a failure) or on the client's cancel (an
                # abort), whichever comes first: counted once either way.
                failed = (cluster.metric(serve, "pdserve_request_failures_total", role="router",
                                         code="DEADLINE_EXCEEDED") +
                          cluster.metric(serve, "pdserve_request_success_total", role="router",
                                         finished_reason="abort"))
                usage = cluster.metric(serve, "pdserve_kv_cache_usage_perc", role="decode")
                running = cluster.metric(serve, "pdserve_num_requests_running", role="decode")
                if (aborted, failed, usage, running) == (1, 1, 0, 0):
                    break
                self.assertLess(time.time(), deadline,
                                f"abort {aborted}, router ends {failed}, KV usage {usage}, running {running}")
                time.sleep(0.05)
        finally:
            self.assertEqual(serve.stop(), 0)

    def test_request_timeout_and_cancels_free_everything_in_serve(self):
        """In serve (its router reaches the decode worker in-process): a request's own timeout_ms
        ends it DEADLINE_EXCEEDED, clients that cancel mid-stream end theirs, and afterwards the
        decode worker runs nothing and holds no block."""
        model = os.path.join(os.path.dirname(MODEL), "wide")
        if not os.path.exists(model):
            subprocess.run([PDSERVE, "make-model", model, "--layers", "4", "--hidden", "256", "--heads", "4",
                            "--kv-heads", "2", "--vocab", "768", "--max-position", "8192"],
                           check=True, capture_output=True)
        cluster.stubs_dir()
        import grpc
        from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg
        serve = cluster.Process(PDSERVE, ["serve", "--model", model, "--listen", "127.0.0.1:0", "--threads", "1",
                                          "--kv-memory-gib", "0.05", "--metrics-listen", "127.0.0.1:0"])
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(serve.grpc))

            def req(timeout_ms=0, max_tokens=4000):
                return pb.GenerateRequest(text=PROMPT, timeout_ms=timeout_ms, sampling=pb.SamplingParams(
                    max_tokens=max_tokens, ignore_eos=True, temperature=0))

            start = time.time()
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(req(timeout_ms=300), timeout=60))
            self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED, e.exception.details())
            self.assertLess(time.time() - start, 30)
            streams = [stub.Generate(req(), timeout=60) for _ in range(8)]
            for s in streams:
                next(s)  # A token arrived: the request runs on the decode worker.
            for s in streams:
                s.cancel()
            deadline = time.time() + 20
            while True:
                usage = cluster.metric(serve, "pdserve_kv_cache_usage_perc", role="decode")
                running = cluster.metric(serve, "pdserve_num_requests_running", role="decode")
                aborted = cluster.metric(serve, "pdserve_request_success_total", role="decode", finished_reason="abort")
                if (usage, running, aborted) == (0, 0, 9):
                    break
                self.assertLess(time.time(), deadline, f"KV usage {usage}, running {running}, aborted {aborted}")
                time.sleep(0.05)
            # And it still serves.
            got = list(stub.Generate(req(max_tokens=5), timeout=60))
            self.assertEqual(sum(len(m.token_ids) for m in got), 5)
        finally:
            self.assertEqual(serve.stop(), 0)

    def test_streamed_text_is_utf8_and_equals_detokenize(self):
        """Random prompts sampled at temperature 1 from a random model: ids 0..255 are single
        bytes, so most completions are broken UTF-8, cut at every length by max_tokens. Each
        message must parse (its text valid UTF-8), end with a finish_reason, and the texts
        concatenated must equal `pdserve detokenize` of the ids."""
        cluster.stubs_dir()
        import grpc
        from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pb_grpc
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(self.serve.grpc))
        rng = random.Random(16)
        # Prompts that end with a lead byte (0xC0-0xF4) as often as not: the reported case.
        cases = []
        for i in range(400):
            prompt = [rng.randrange(768) for _ in range(rng.randrange(1, 6))]
            if i % 2 == 0:
                prompt.append(rng.randrange(0xC2, 0xF5))
            cases.append((prompt, rng.randrange(1, 17), i))

        def run(case):
            prompt, max_tokens, seed = case
            request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), sampling=pb.SamplingParams(
                max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True))
            ids, texts, finish = [], [], []
            for r in stub.Generate(request, timeout=60):
                self.assertEqual(finish, [], "a message after finish_reason")
                ids += list(r.token_ids)
                texts.append(r.text)
                if r.finish_reason:
                    finish.append(r.finish_reason)
            return ids, texts, finish

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(run, cases))
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for ids, _, _ in results:
                f.write(json.dumps({"token_ids": ids}) + "\n")
        decoded = subprocess.run([PDSERVE, "detokenize", "--tokenizer", MODEL, "--input-jsonl", f.name,
                                  "--skip-special-tokens", "--clean-up-tokenization-spaces", "false"],
                                 capture_output=True, text=True, check=True).stdout.splitlines()
        os.unlink(f.name)
        broken = 0
        for (prompt, max_tokens, _), (ids, texts, finish), line in zip(cases, results, decoded):
            self.assertEqual(finish, ["length"], prompt)
            self.assertEqual(len(ids), max_tokens, prompt)
            want = json.loads(line)["text"]
            self.assertEqual("".join(texts), want, f"prompt {prompt} ids {ids} pieces {texts}")
            broken += "\ufffd" in want
        # The test means something only if many completions were broken UTF-8.
        self.assertGreater(broken, 100)

    def test_reported_prompt_streams_the_whole_text(self):
        """The report: `--prompt-ids 198` (byte 0xC6, a lead byte) on a small random model gave
        empty text, a lost message and exit 0."""
        model = os.path.join(os.path.dirname(MODEL), "small")
        if not os.path.exists(model):
            subprocess.run([PDSERVE, "make-model", model, "--layers", "2", "--hidden", "64", "--heads", "4",
                            "--kv-heads", "2"], check=True, capture_output=True)
        serve = cluster.Process(PDSERVE, ["serve", "--model", model, "--listen", "127.0.0.1:0",
                                          "--threads", "1", "--kv-memory-gib", "0.05"])
        try:
            for prompt in ("198", "198,198", "240,159"):
                out = subprocess.run([PDSERVE, "generate", "--server", serve.grpc, "--prompt-ids", prompt,
                                      "--max-tokens", "12", "--temperature", "0", "--format", "json"],
                                     capture_output=True, text=True)
                self.assertEqual(out.returncode, 0, out.stderr)
                got = json.loads(out.stdout)
                self.assertEqual(len(got["token_ids"]), 12)
                self.assertEqual(got["finish_reason"], "length")
                want = subprocess.run([PDSERVE, "detokenize", "--tokenizer", model, "--ids",
                                       ",".join(map(str, got["token_ids"])), "--skip-special-tokens",
                                       "--clean-up-tokenization-spaces", "false", "--format", "json"],
                                      capture_output=True, text=True, check=True).stdout
                self.assertEqual(got["text"], json.loads(want)["text"])
        finally:
            serve.stop()

    def test_generate_client_refuses_a_broken_stream(self):
        """A fault-injecting stand-in for the router (raw protobuf bytes): a message whose text is
        not UTF-8, a stream that ends without finish_reason, a message with fewer logprobs than
        ids. `pdserve generate --server` must exit non-zero and say why, every time."""
        import grpc

        def varint(n):
            out = b""
            while True:
                byte, n = n & 0x7F, n >> 7
                out += bytes([byte | (0x80 if n else 0)])
                if not n:
                    return out

        def message(ids=(), text=b"", logprobs=None, finish=b""):
            logprobs = [-1.0] * len(ids) if logprobs is None else logprobs
            out = b""
            if ids:
                packed = b"".join(varint(i) for i in ids)
                out += b"\x12" + varint(len(packed)) + packed
            if text:
                out += b"\x1a" + varint(len(text)) + text
            if logprobs:
                packed = b"".join(struct.pack("<f", x) for x in logprobs)
                out += b"\x22" + varint(len(packed)) + packed
            if finish:
                out += b"\x32" + varint(len(finish)) + finish
            return out

        streams = {  # name: (messages, what the error must say)
            "not_utf8": ([message([65], b"A"), message([198], b"\xc6"), message([66], b"B", finish=b"length")],
                         "message 2's text is not valid UTF-8"),
            "not_utf8_last": ([message([65], b"A"), message([198], b"\xc6", finish=b"length")],
                              "message 2's text is not valid UTF-8"),
            "no_finish": ([message([65], b"A"), message([66], b"B")], "without a finish_reason"),
            "logprobs": ([message([65, 66], b"AB", logprobs=[-1.0]), message([67], b"C", finish=b"length")],
                         "2 token ids, 1 logprobs"),
            "after_finish": ([message([65], b"A", finish=b"length"), message([66], b"B")],
                             "after the one that carried finish_reason"),
        }
        current = []

        def generate(request, context):
            yield from current

        handler = grpc.method_handlers_generic_handler("pdserve.v1.Generation", {
            "Generate": grpc.unary_stream_rpc_method_handler(
                generate, request_deserializer=lambda b: b, response_serializer=lambda b: b)})
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            for name, (stream, why) in streams.items():
                current[:] = stream
                out = subprocess.run([PDSERVE, "generate", "--server", f"127.0.0.1:{port}", "--prompt-ids", "1",
                                      "--max-tokens", "3", "--format", "json"], capture_output=True, text=True,
                                     timeout=60)
                self.assertNotEqual(out.returncode, 0, f"{name}: {out.stdout}")
                self.assertIn(why, out.stderr, name)
            # The same stand-in with a well-formed stream: exit 0, so the refusals above are real.
            current[:] = [message([65], b"A"), message([66], b"B", finish=b"length")]
            out = subprocess.run([PDSERVE, "generate", "--server", f"127.0.0.1:{port}", "--prompt-ids", "1",
                                  "--max-tokens", "2", "--format", "json"], capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(json.loads(out.stdout)["text"], "AB")
        finally:
            server.stop(0)


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
