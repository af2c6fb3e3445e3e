"""TLS on the public port, mutual TLS between the tiers, API keys, request size limits: real
processes, certificates made here with the openssl command.

Run: /usr/bin/python3 tests/e2e/test_security.py --pdserve build/pdserve
"""

import argparse
import json
import os
import random
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402

PDSERVE = None
WORKDIR = None
MODEL = None
CERTS = None
API_KEY = "pdk-3f9c1e7a-secret-4b2d"


def make_ca(name):
    cluster.make_ca(CERTS, name)


def make_leaf(name, ca):
    cluster.make_leaf(CERTS, name, ca)


def path(name):
    return os.path.join(CERTS, name)


def read(name):
    with open(path(name), "rb") as f:
        return f.read()


def tls_args(leaf="node"):
    return ("--tls-cert", path(f"{leaf}.pem"), "--tls-key", path(f"{leaf}.key"), "--tls-ca", path("ca.pem"))


def request(ids, max_tokens=8):
    sp = pb.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sp)


def collect(stub, req, metadata=None):
    out = {"token_ids": [], "logprobs": []}
    for r in stub.Generate(req, timeout=60, metadata=metadata):
        out["token_ids"] += list(r.token_ids)
        out["logprobs"] += list(r.logprobs)
    return out


def local(ids, max_tokens=8):
    out = subprocess.run([PDSERVE, "generate", "--model", MODEL, "--prompt-ids", ",".join(map(str, ids)),
                          "--max-tokens", str(max_tokens), "--temperature", "0", "--ignore-eos",
                          "--logprobs", "1", "--format", "json", "--threads", "1",
                          "--kv-memory-gib", "0.05"], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    return {"token_ids": got["token_ids"], "logprobs": got["logprobs"]}


def secure(address, ca="ca.pem", leaf=None, leaf_ca=None):
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(ca),
        private_key=read(f"{leaf}.key") if leaf else None,
        certificate_chain=read(f"{leaf}.pem") if leaf else None)
    return grpc.secure_channel(address, creds)


AUTH = (("authorization", f"Bearer {API_KEY}"),)


class SecurityTest(unittest.TestCase):
    def assertRefused(self, fn, code, text=None):
        with self.assertRaises(grpc.RpcError) as e:
            fn()
        self.assertEqual(e.exception.code(), code, e.exception.details())
        if text:
            self.assertIn(text, e.exception.details())
        self.assertNotIn(API_KEY, e.exception.details() or "")
        return e.exception

    def idle_decode_info(self, stub, timeout=20):
        """The decode worker's info once it runs and holds nothing (fails after `timeout`)."""
        deadline = time.time() + timeout
        while True:
            info = stub.GetWorkerInfo(worker_pb2.GetWorkerInfoRequest(), timeout=10)
            if info.used_blocks == 0 and info.running == 0 and info.waiting == 0:
                self.assertEqual(info.free_blocks + info.cached_blocks, info.total_blocks)
                return info
            if time.time() > deadline:
                self.fail(f"decode worker still holds {info.used_blocks} blocks, runs {info.running}")
            time.sleep(0.05)

    def test_mtls_between_tiers_tls_and_api_keys_on_the_public_port(self):
        with open(path("keys.txt"), "w") as f:
            f.write(f"# API keys\n{API_KEY}\n\nsecond-key-xyz\n")
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, prefill_args=tls_args(),
                            decode_args=tls_args(),
                            router_args=tls_args() + ("--api-key-file", path("keys.txt")),
                            env={"PDSERVE_LOG_LEVEL": "debug"})  # The most verbose: no key logged even so.
        try:
            ids = [random.Random(1).randrange(3, 500) for _ in range(60)]  # Remote prefill.
            want = local(ids)
            stub = pbg.GenerationStub(secure(c.router.grpc))
            # With TLS and a key: same output as the local engine, KV pages through mTLS'd tiers.
            self.assertEqual(collect(stub, request(ids), AUTH), want)
            self.assertEqual(collect(stub, request(ids), (("authorization", "Bearer second-key-xyz"),)), want)
            d = worker_pb2_grpc.DecodeWorkerStub(secure(c.decode[0].grpc, leaf="node"))
            info = d.GetWorkerInfo(worker_pb2.GetWorkerInfoRequest(), timeout=10)
            self.assertGreaterEqual(info.transfers_completed, 1)

            # The public API without a key, with a wrong one, or malformed: UNAUTHENTICATED.
            self.assertRefused(lambda: collect(stub, request(ids)), grpc.StatusCode.UNAUTHENTICATED,
                               "missing API key")
            self.assertRefused(lambda: collect(stub, request(ids), (("authorization", f"Bearer {API_KEY}x"),)),
                               grpc.StatusCode.UNAUTHENTICATED, "invalid API key")
            self.assertRefused(lambda: collect(stub, request(ids), (("authorization", API_KEY),)),
                               grpc.StatusCode.UNAUTHENTICATED, "Bearer")
            self.assertRefused(lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10),
                               grpc.StatusCode.UNAUTHENTICATED)
            self.assertRefused(lambda: stub.Tokenize(pb.TokenizeRequest(text="hi"), timeout=10),
                               grpc.StatusCode.UNAUTHENTICATED)
            admin = worker_pb2_grpc.RouterAdminStub(secure(c.router.grpc))
            self.assertRefused(lambda: admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10),
                               grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=AUTH).vocab_size, 512)
            # The refused requests left nothing behind on the decode worker.
            self.assertEqual(self.idle_decode_info(d).used_blocks, 0)

            # Plain text to the TLS port, or a client that trusts another CA: no connection.
            plain = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            self.assertRefused(lambda: collect(plain, request(ids), AUTH), grpc.StatusCode.UNAVAILABLE)
            rogue_trust = pbg.GenerationStub(secure(c.router.grpc, ca="rogue.pem"))
            self.assertRefused(lambda: collect(rogue_trust, request(ids), AUTH), grpc.StatusCode.UNAVAILABLE)

            # Internal services refuse callers without a client certificate of the tiers' CA.
            for worker, stub_type in ((c.decode[0], worker_pb2_grpc.DecodeWorkerStub),
                                      (c.prefill[0], worker_pb2_grpc.PrefillWorkerStub)):
                for channel in (secure(worker.grpc),                      # No client certificate.
                                secure(worker.grpc, leaf="intruder"),     # Signed by another CA.
                                grpc.insecure_channel(worker.grpc)):      # No TLS at all.
                    s = stub_type(channel)
                    self.assertRefused(lambda: s.GetWorkerInfo(worker_pb2.GetWorkerInfoRequest(), timeout=10),
                                       grpc.StatusCode.UNAVAILABLE)
                ok = stub_type(secure(worker.grpc, leaf="node"))
                self.assertEqual(ok.GetWorkerInfo(worker_pb2.GetWorkerInfoRequest(), timeout=10).vocab_size, 512)

            # The KV transport is mutual TLS too: a plaintext peer, or one with another CA's
            # certificate, gets nothing; one with the tiers' certificate completes the handshake
            # (Python's own TLS stack) and is answered (here: a layout refusal naming the key).
            host, port = info.transport_endpoint[len("tcp://"):].rsplit(":", 1)
            hello = struct.pack("<IIQQQ", 0x564b4450, 1, 0, 0, 9) + b"block=999"
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(hello)
                self.assertEqual(raw.recv(64), b"")  # Closed: no TLS handshake.
            for leaf, accepted in (("intruder", False), ("node", True)):
                ctx = ssl.create_default_context(cafile=path("ca.pem"))
                ctx.load_cert_chain(path(f"{leaf}.pem"), path(f"{leaf}.key"))
                with socket.create_connection((host, int(port)), timeout=10) as raw:
                    try:
                        with ctx.wrap_socket(raw, server_hostname=host) as tls:
                            tls.sendall(hello)
                            reply = tls.recv(8)
                            while len(reply) < 8:
                                more = tls.recv(8 - len(reply))
                                if not more:
                                    break
                                reply += more
                    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                        reply = b""
                if accepted:
                    self.assertEqual(len(reply), 8)
                    self.assertEqual(struct.unpack("<II", reply)[0], 1)  # Refused layout, over TLS.
                else:
                    self.assertEqual(reply, b"")

            # A router without the tiers' certificate cannot use them.
            r = subprocess.run([PDSERVE, "router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                "--decode", c.decode[0].grpc, "--worker-wait-seconds", "2"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertIn("no decode worker", r.stderr)

            # `pdserve generate --server` with the CA and a key (from the environment).
            env = dict(os.environ, PDSERVE_API_KEY=API_KEY)
            out = subprocess.run([PDSERVE, "generate", "--server", c.router.grpc, "--server-ca", path("ca.pem"),
                                  "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", "8",
                                  "--temperature", "0", "--ignore-eos", "--logprobs", "1", "--format", "json"],
                                 capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(json.loads(out.stdout)["token_ids"], want["token_ids"])

            # `pdserve bench` through TLS with the key; without it every request is refused.
            bench = [PDSERVE, "bench", "--server", c.router.grpc, "--server-ca", path("ca.pem"),
                     "--num-prompts", "3", "--input-len", "8", "--output-len", "2", "--format", "json"]
            out = subprocess.run(bench, capture_output=True, text=True, env=env, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(json.loads(out.stdout)[0]["ok"], 3)
            out = subprocess.run(bench, capture_output=True, text=True, timeout=120,
                                 env={k: v for k, v in os.environ.items() if k != "PDSERVE_API_KEY"})
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn("missing API key", out.stderr)
        finally:
            logs = [p.stderr() for p in [c.router] + c.workers]
            self.assertEqual(c.stop(), [0] * 3)
        for log in logs:
            self.assertNotIn(API_KEY, log)  # No secret in logs.

    def test_serve_with_keys_from_the_environment_and_a_request_size_limit(self):
        serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                          "--kv-memory-gib", "0.05", "--tls-cert", path("node.pem"),
                                          "--tls-key", path("node.key"), "--max-request-bytes", "4096"],
                                env={"PDSERVE_API_KEYS": f" {API_KEY} , other-key "})
        try:
            stub = pbg.GenerationStub(secure(serve.grpc))
            self.assertEqual(len(collect(stub, request([5, 6, 7]), AUTH)["token_ids"]), 8)
            self.assertEqual(len(collect(stub, request([5, 6, 7]), (("authorization", "Bearer other-key"),))["token_ids"]), 8)
            self.assertRefused(lambda: collect(stub, request([5, 6, 7])), grpc.StatusCode.UNAUTHENTICATED)
            big = pb.GenerateRequest(text="x" * 8000, sampling=pb.SamplingParams(max_tokens=1))
            self.assertRefused(lambda: collect(stub, big, AUTH), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertEqual(len(collect(stub, request([5, 6, 7]), AUTH)["token_ids"]), 8)  # Still serving.
            # The oversized and unauthenticated requests leaked no block: serve's decode worker,
            # as the router's latest load report shows it, holds nothing once idle.
            admin = worker_pb2_grpc.RouterAdminStub(secure(serve.grpc))
            deadline = time.time() + 20
            while True:
                stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10, metadata=AUTH)
                info = stats.decode[0].info
                if info.used_blocks == 0 and info.running == 0:
                    break
                self.assertLess(time.time(), deadline, f"decode worker holds {info.used_blocks} blocks")
                time.sleep(0.05)
            self.assertEqual(info.free_blocks + info.cached_blocks, info.total_blocks)
        finally:
            self.assertEqual(serve.stop(), 0, serve.stderr()[-3000:])

    def test_ucx_with_mutual_tls_says_its_pages_are_not_encrypted(self):
        ucx = subprocess.run([PDSERVE, "bench-transport", "--transport", "ucx", "--bytes", "65536",
                              "--page-bytes", "4096", "--repeats", "1"], capture_output=True, text=True,
                             timeout=60, env=dict(os.environ, UCX_TLS="sm,self"))
        if "not built in" in ucx.stderr:
            self.skipTest("needs ucx: built without libucx-dev")
        p = cluster.Process(PDSERVE, ["decode", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                      "--kv-memory-gib", "0.05", "--transport", "ucx", *tls_args()],
                            env={"UCX_TLS": "sm,self", "PDSERVE_LOG_LEVEL": "warning"})
        try:
            self.assertIn("KV pages over ucx are not encrypted", p.stderr())
        finally:
            self.assertEqual(p.stop(), 0)
        p = cluster.Process(PDSERVE, ["decode", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                      "--kv-memory-gib", "0.05", *tls_args()])
        try:
            self.assertNotIn("not encrypted", p.stderr())  # tcp: the pages are encrypted.
        finally:
            self.assertEqual(p.stop(), 0)

    def test_bad_tls_and_key_flags_are_usage_errors(self):
        with open(path("empty-keys.txt"), "w") as f:
            f.write("# none\n\n")
        cases = [
            (["--tls-cert", path("node.pem")], "--tls-cert and --tls-key"),
            (["--tls-ca", path("ca.pem")], "--tls-ca"),
            (["--tls-cert", path("node.csr"), "--tls-key", path("node.key")], "--tls-cert"),
            (["--tls-cert", path("missing.pem"), "--tls-key", path("node.key")], "--tls-cert: cannot read"),
            (["--api-key-file", path("empty-keys.txt")], "--api-key-file"),
            (["--api-key-file", path("nope.txt")], "--api-key-file"),
            (["--max-request-bytes", "10"], "--max-request-bytes"),
        ]
        for args, text in cases:
            r = subprocess.run([PDSERVE, "serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                "--kv-memory-gib", "0.05", *args], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(text, r.stderr, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_security_")
    MODEL = os.path.join(WORKDIR, "model")
    CERTS = os.path.join(WORKDIR, "certs")
    os.makedirs(CERTS)
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "llama", "--layers", "2", "--hidden", "64",
                    "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--seed", "3"],
                   check=True, capture_output=True)
    make_ca("ca")
    make_ca("rogue")
    make_leaf("node", "ca")
    make_leaf("intruder", "rogue")
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
