"""LoRA adapters served end to end: `serve` and the separate tiers with --lora-modules, requests
naming an adapter through gRPC (sampling.lora_name) and the OpenAI API (`model`), against a local
`pdserve generate` with the same adapter (itself checked against the float64 reference in
tests/reference/test_parity.py). The adapters are random ones in PEFT's layout written with numpy.

Run: /usr/bin/python3 tests/e2e/test_lora.py --pdserve build/pdserve
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
import cluster  # noqa: E402
import lora_util  # noqa: E402
from peft_adapter import write_lora  # noqa: E402
import grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "models", "pdserve-demo")
PDSERVE = None
WORKDIR = None
ADAPTERS = {}  # name -> directory
PROMPT = list(range(100, 160))  # 60 tokens: prefilled by a prefill worker in the tiers test.


def setUpModule():
    for name, seed, rank in (("psalms", 1, 8), ("other", 2, 16)):
        ADAPTERS[name] = os.path.join(WORKDIR, name)
        write_lora(ADAPTERS[name], MODEL, rank=rank, alpha=2 * rank, seed=seed, b_std=0.05)


def lora_flags(names=("psalms", "other")):
    return ["--lora-modules", ",".join(f"{n}={ADAPTERS[n]}" for n in names)]


def local(ids, adapter="", max_tokens=12):
    return lora_util.local(PDSERVE, MODEL, ids, lora_flags()[1] if adapter else "", adapter, max_tokens)


generate = lora_util.generate


def http(process, path, body=None):
    """(status, parsed JSON)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{process.addresses['http']}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                          "--kv-memory-gib", "0.1", "--http-listen", "127.0.0.1:0",
                                          "--metrics-listen", "127.0.0.1:0", "--metrics-compat", "vllm",
                                          *lora_flags()])

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def test_models_lists_the_base_and_each_adapter_with_its_parent(self):
        status, models = http(self.s, "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual([(m["id"], m.get("parent")) for m in models["data"]],
                         [("pdserve-demo", None), ("psalms", "pdserve-demo"), ("other", "pdserve-demo")])
        self.assertEqual(http(self.s, "/v1/models/psalms")[1]["parent"], "pdserve-demo")
        self.assertEqual(http(self.s, "/v1/models/nope")[0], 404)
        info = pbg.GenerationStub(grpc.insecure_channel(self.s.grpc)).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        self.assertEqual([(a.name, a.rank) for a in info.lora_adapters], [("psalms", 8), ("other", 16)])

    def test_each_adapter_answers_as_a_local_run_with_it_and_unlike_the_base(self):
        outs = {}
        for adapter in ("", "psalms", "other"):
            got = generate(self.s.grpc, PROMPT[:20], adapter)
            want = local(PROMPT[:20], adapter)
            self.assertEqual(got["token_ids"], want["token_ids"], adapter)
            self.assertEqual(got["logprobs"], [float(x) for x in want["logprobs"]], adapter)
            outs[adapter] = got["token_ids"]
        self.assertNotEqual(outs[""], outs["psalms"])
        self.assertNotEqual(outs["psalms"], outs["other"])

    def test_the_openai_model_names_the_adapter(self):
        want = generate(self.s.grpc, PROMPT[:15], "psalms")
        status, body = http(self.s, "/v1/completions", {"model": "psalms", "prompt": PROMPT[:15], "max_tokens": 12,
                                                        "temperature": 0, "ignore_eos": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["model"], "psalms")
        self.assertEqual(body["choices"][0]["text"], want["text"])

    def test_an_unknown_model_is_404_and_the_server_goes_on(self):
        status, body = http(self.s, "/v1/completions", {"model": "nope", "prompt": "And", "max_tokens": 2})
        self.assertEqual(status, 404, body)
        self.assertEqual((body["error"]["code"], body["error"]["param"]), ("model_not_found", "model"))
        self.assertIn("nope", body["error"]["message"])
        with self.assertRaises(grpc.RpcError) as e:
            generate(self.s.grpc, PROMPT[:5], "nope")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("sampling.lora_name", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            generate(self.s.grpc, PROMPT[:5], "x" * 300)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(generate(self.s.grpc, PROMPT[:5], "psalms")["token_ids"],
                         local(PROMPT[:5], "psalms")["token_ids"])

    def lora_info(self):
        """The decode worker's vllm:lora_requests_info series: its labels."""
        with urllib.request.urlopen(f"http://{self.s.addresses['metrics']}/metrics", timeout=10) as r:
            text = r.read().decode()
        series = [line for line in text.splitlines()
                  if line.startswith("vllm:lora_requests_info{") and 'role="decode"' in line]
        self.assertEqual(len(series), 1, series)  # One series: the previous one is removed.
        return dict(re.findall(r'(\w+)="([^"]*)"', series[0]))

    def test_lora_requests_info_names_the_adapters_running(self):
        done = threading.Event()
        thread = threading.Thread(target=lambda: (generate(self.s.grpc, PROMPT[:10], "other", max_tokens=1500),
                                                  done.set()))
        thread.start()
        seen = None
        while not done.is_set():
            labels = self.lora_info()
            if labels["running_lora_adapters"] == "other":
                seen = labels
                break
            time.sleep(0.02)
        thread.join()
        self.assertIsNotNone(seen, "the running adapter never showed")
        self.assertEqual((seen["max_lora"], seen["waiting_lora_adapters"]), ("0", ""))
        deadline = time.time() + 10
        while self.lora_info()["running_lora_adapters"] and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.lora_info()["running_lora_adapters"], "")

    def test_an_adapter_never_reuses_the_base_models_prefix_or_another_adapters(self):
        prompt = [7] + PROMPT[:47]  # Three whole blocks of 16 before the last token.
        generate(self.s.grpc, prompt, "", max_tokens=2)
        self.assertEqual(generate(self.s.grpc, prompt, "", max_tokens=2)["cached"], 32)
        self.assertEqual(generate(self.s.grpc, prompt, "psalms", max_tokens=2)["cached"], 0)
        self.assertEqual(generate(self.s.grpc, prompt, "other", max_tokens=2)["cached"], 0)
        again = generate(self.s.grpc, prompt, "psalms", max_tokens=2)
        self.assertEqual(again["cached"], 32)
        self.assertEqual(again["token_ids"], local(prompt, "psalms", max_tokens=2)["token_ids"])


class TiersTest(unittest.TestCase):
    def test_adapters_prefilled_on_a_prefill_worker_and_only_where_served(self):
        # Two decode workers, only the first serving "psalms": its requests go there; the prefill
        # worker computes their prompts with the adapter and sends the pages.
        prefill = cluster.Process(PDSERVE, ["prefill", "--listen", "127.0.0.1:0", "--model", MODEL, "--threads", "1",
                                            "--kv-memory-gib", "0.05", *lora_flags()])
        with_lora = cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL, "--threads", "1",
                                              "--kv-memory-gib", "0.05", "--local-prefill-tokens", "4",
                                              *lora_flags(["psalms"])])
        plain = cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL, "--threads", "1",
                                          "--kv-memory-gib", "0.05", "--local-prefill-tokens", "4"])
        router = cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                           "--prefill", prefill.grpc, "--decode", f"{with_lora.grpc},{plain.grpc}",
                                           "--local-prefill-tokens", "4", "--policy", "round_robin"])
        try:
            for i in range(4):
                ids = [11 + i] + PROMPT
                got = generate(router.grpc, ids, "psalms")
                want = local(ids, "psalms")
                self.assertEqual(got["token_ids"], want["token_ids"], i)
                self.assertEqual(got["logprobs"], [float(x) for x in want["logprobs"]], i)
            served = cluster.worker_info(with_lora.grpc, False)
            self.assertEqual(served.remote_prefills, 4)
            self.assertEqual(cluster.worker_info(plain.grpc, False).remote_prefills +
                             cluster.worker_info(plain.grpc, False).local_prefills, 0)
            # "other" is served by the prefill worker only: no decode worker can run it.
            with self.assertRaises(grpc.RpcError) as e:
                generate(router.grpc, PROMPT[:8], "other")
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
            # Base requests still use both decode workers.
            for i in range(2):
                ids = [30 + i] + PROMPT[:30]
                self.assertEqual(generate(router.grpc, ids)["token_ids"], local(ids)["token_ids"])
            self.assertGreater(cluster.worker_info(plain.grpc, False).remote_prefills, 0)
        finally:
            codes = [p.stop() for p in (router, with_lora, plain, prefill)]
        self.assertEqual(codes, [0, 0, 0, 0])

    def test_a_bad_adapter_is_refused_at_start_naming_it(self):
        bad = os.path.join(WORKDIR, "bad")
        write_lora(bad, MODEL, rank=32, seed=3)
        for flags, want in ((["--lora-modules", f"x={bad}"], "above this server's --max-lora-rank 16"),
                            (["--lora-modules", f"x={WORKDIR}/missing"], "adapter_config.json"),
                            (["--lora-modules", "x"], "is not NAME=PATH")):
            out = subprocess.run([PDSERVE, "serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                  "--kv-memory-gib", "0.05", *flags], capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("--lora-modules", out.stderr)
            self.assertIn(want, out.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_lora_")
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
