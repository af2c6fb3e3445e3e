"""The disaggregated tiers end to end, as real processes on loopback.

Run: /usr/bin/python3 tests/e2e/test_tiers.py --pdserve build/pdserve
"""

import argparse
import concurrent.futures
import json
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
from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402

PDSERVE = None
WORKDIR = None
MODEL = None
BLOCK = 16
LAYERS = 2


def prompts(n, seed, lo=5, hi=200):
    return cluster.prompts(n, seed, lo, hi)


def local(ids, max_tokens=16, extra=(), model=None):
    out = subprocess.run([PDSERVE, "generate", "--model", model or MODEL, "--prompt-ids", ",".join(map(str, ids)),
                          "--max-tokens", str(max_tokens), "--temperature", "0", "--ignore-eos",
                          "--logprobs", "2", "--format", "json", "--threads", "1",
                          "--kv-memory-gib", "0.05", *extra], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def request(ids, max_tokens=16, **sampling):
    sp = pb.SamplingParams(**{"temperature": 0, **sampling}, max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sp)


def collect(stub, req, timeout=120):
    out = {"token_ids": [], "logprobs": [], "top": [], "text": "", "finish_reason": "", "usage": None}
    for r in stub.Generate(req, timeout=timeout):
        out["token_ids"] += list(r.token_ids)
        out["logprobs"] += list(r.logprobs)
        out["top"] += [[(t.token_id, t.logprob) for t in s.top] for s in r.top_logprobs]
        out["text"] += r.text
        if r.finish_reason:
            out["finish_reason"] = r.finish_reason
            out["usage"] = r.usage
    return out


def same_as_local(test, got, want):
    test.assertEqual(got["token_ids"], want["token_ids"])
    # Bitwise: the JSON of the local run holds the float32 logprob exactly; so does the proto.
    test.assertEqual([float(x) for x in got["logprobs"]], [float(x) for x in want["logprobs"]])
    test.assertEqual(got["top"], [[(t["token_id"], t["logprob"]) for t in s] for s in want["top_logprobs"]])
    test.assertEqual(got["text"], want["text"])
    test.assertEqual(got["finish_reason"], want["finish_reason"])


def info(process, prefill):
    return cluster.worker_info(process.grpc, prefill)


def wait_no_blocks_in_use(test, c, timeout=20):
    return cluster.wait_idle(test, [(p, True) for p in c.prefill] + [(d, False) for d in c.decode], timeout)


class TiersTest(unittest.TestCase):
    def test_disaggregated_equals_local_and_serve(self):
        ps = prompts(20, 1)
        want = [local(p) for p in ps]
        c = cluster.Cluster(PDSERVE, MODEL, prefill=2, decode=2)
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                got = list(pool.map(lambda p: collect(stub, request(p)), ps))
            for g, w in zip(got, want):
                same_as_local(self, g, w)
            decodes = [info(d, False) for d in c.decode]
            self.assertGreater(sum(i.remote_prefills for i in decodes), 10)
            self.assertEqual(sum(i.transfers_completed for i in decodes), sum(i.remote_prefills for i in decodes))
            self.assertEqual(sum(i.transfer_failures for i in decodes), 0)
            self.assertGreater(sum(info(p, True).transfers_completed for p in c.prefill), 0)
            wait_no_blocks_in_use(self, c)
        finally:
            self.assertEqual(c.stop(), [0] * 5)  # SIGTERM: clean exit everywhere.
        serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0",
                                          "--threads", "1", "--kv-memory-gib", "0.05",
                                          "--local-prefill-tokens", "4"])
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(serve.grpc))
            for p, w in zip(ps, want):
                same_as_local(self, collect(stub, request(p)), w)
        finally:
            self.assertEqual(serve.stop(), 0)

    def test_transfer_moves_every_page_once(self):
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1)
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            ids = prompts(1, 99, 150, 151)[0]
            before = info(c.decode[0], False)
            same_as_local(self, collect(stub, request(ids)), local(ids))
            after = info(c.decode[0], False)
            blocks = (len(ids) + BLOCK - 1) // BLOCK
            self.assertEqual(after.transfer_pages - before.transfer_pages, blocks * LAYERS)
            self.assertEqual(after.transfer_bytes - before.transfer_bytes, blocks * LAYERS * after.page_bytes)
            sent = info(c.prefill[0], True)
            self.assertEqual(sent.transfer_bytes, blocks * LAYERS * after.page_bytes)
            # The same prompt again: the decode worker holds its full blocks, only the last moves;
            # the prefill worker computed only the last block too, and usage says so.
            got = collect(stub, request(ids))
            same_as_local(self, got, local(ids))
            again = info(c.decode[0], False)
            self.assertEqual(again.transfer_pages - after.transfer_pages, LAYERS)
            self.assertEqual(got["usage"].cached_tokens, (len(ids) // BLOCK) * BLOCK)
            self.assertEqual(again.remote_prefills - after.remote_prefills, 1)
        finally:
            c.stop()

    def test_short_uncached_part_is_prefilled_on_the_decode_worker(self):
        # Conditional disaggregation: the router sends a prompt whose uncached part (on the chosen
        # decode worker) is at most --local-prefill-tokens straight to decode, without a transfer.
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1,
                            router_args=("--local-prefill-tokens", "8"),
                            decode_args=("--local-prefill-tokens", "8"))
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            admin = worker_pb2_grpc.RouterAdminStub(grpc.insecure_channel(c.router.grpc))
            ids = prompts(1, 7, 100, 101)[0]
            same_as_local(self, collect(stub, request(ids)), local(ids))
            first = info(c.decode[0], False)
            self.assertEqual(first.remote_prefills, 1)
            # Wait until the router has seen the decode worker's KV events for those blocks.
            deadline = time.time() + 10
            while time.time() < deadline:
                stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
                if stats.decode[0].info.cached_blocks >= len(ids) // BLOCK:
                    break
                time.sleep(0.05)
            got = collect(stub, request(ids))
            same_as_local(self, got, local(ids))
            second = info(c.decode[0], False)
            self.assertEqual(second.remote_prefills, 1)
            self.assertEqual(second.local_prefills - first.local_prefills, 1)
            self.assertEqual(second.transfer_pages, first.transfer_pages)
            self.assertEqual(got["usage"].cached_tokens, (len(ids) // BLOCK) * BLOCK)
            stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
            self.assertEqual((stats.requests, stats.remote_prefills, stats.local_prefills), (2, 1, 1))
            self.assertEqual(stats.policy, "kv_aware")
        finally:
            self.assertEqual(c.stop(), [0] * 3)

    def test_corrupted_page_is_refused_and_the_request_still_completes(self):
        # Fault injection: the prefill worker flips a byte of the 3rd page it sends.
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1,
                            prefill_env={"PDSERVE_FAULT_CORRUPT_KV_PAGE": "3"})
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            ids = prompts(1, 5, 100, 101)[0]
            same_as_local(self, collect(stub, request(ids)), local(ids))
            d = info(c.decode[0], False)
            self.assertEqual(d.transfer_failures, 1)
            self.assertEqual(d.transfers_completed, 0)
            self.assertGreaterEqual(d.local_prefills, 1)  # Recomputed here after the refusal.
            wait_no_blocks_in_use(self, c)
        finally:
            c.stop()

    def test_64_concurrent_clients_then_64_that_cancel(self):
        c = cluster.Cluster(PDSERVE, MODEL, prefill=2, decode=2)
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            ps = prompts(64, 7, 3, 120)
            lengths = [random.Random(i).randrange(1, 24) for i in range(64)]
            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                got = list(pool.map(lambda a: collect(stub, request(a[0], a[1])), zip(ps, lengths)))
            for g, n in zip(got, lengths):
                self.assertEqual(len(g["token_ids"]), n)
                self.assertEqual(g["finish_reason"], "length")
            for i in range(0, 64, 16):  # Spot-check against the local engine.
                same_as_local(self, got[i], local(ps[i], lengths[i]))
            wait_no_blocks_in_use(self, c)

            def cancel_at_random(k):
                rng = random.Random(1000 + k)
                call = stub.Generate(request(ps[k], 40))
                after = rng.randrange(0, 6)
                if after == 0:
                    time.sleep(rng.random() * 0.05)
                    call.cancel()
                    return
                for n, _ in enumerate(call):
                    if n + 1 >= after:
                        call.cancel()
                        break

            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                list(pool.map(cancel_at_random, range(64)))
            wait_no_blocks_in_use(self, c)
        finally:
            self.assertEqual(c.stop(), [0] * 5)

    def test_preemption_when_the_decode_pool_is_small(self):
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1,
                            engine_args=("--threads", "1", "--kv-blocks", "24", "--max-model-len", "256"))
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            ps = prompts(10, 11, 60, 90)
            with concurrent.futures.ThreadPoolExecutor(10) as pool:
                got = list(pool.map(lambda p: collect(stub, request(p, 40)), ps))
            for g, p in zip(got, ps):
                same_as_local(self, g, local(p, 40))
            self.assertGreater(info(c.decode[0], False).preemptions, 0)
            wait_no_blocks_in_use(self, c)
        finally:
            c.stop()

    def test_quantized_pages_through_the_tiers(self):
        # int8 and int4 pools: pages with their scales move between the tiers, the output equals
        # a colocated run of the same dtype bitwise, and the bytes are the format's.
        kv_heads, head_dim = 2, 16
        ids = prompts(1, 41, 150, 151)[0]
        blocks = (len(ids) + BLOCK - 1) // BLOCK
        for dtype, row in (("int8", head_dim + 4), ("int4", head_dim // 2 + 4)):
            flag = ("--kv-dtype", dtype)
            c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, decode_args=flag,
                                prefill_args=flag, router_args=flag)
            try:
                stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
                same_as_local(self, collect(stub, request(ids)), local(ids, extra=flag))
                d, p = info(c.decode[0], False), info(c.prefill[0], True)
                self.assertEqual(d.layout.kv_dtype, dtype)
                self.assertEqual(d.page_bytes, 2 * kv_heads * BLOCK * row)
                self.assertEqual(d.kv_bytes_per_token, 2 * LAYERS * kv_heads * row)
                self.assertEqual(d.remote_prefills, 1)
                self.assertEqual(d.transfer_bytes, blocks * LAYERS * d.page_bytes)
                self.assertEqual(p.transfer_bytes, d.transfer_bytes)
                model = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc)).GetModelInfo(
                    pb.GetModelInfoRequest(), timeout=10)
                self.assertEqual((model.kv_dtype, model.kv_bytes_per_token), (dtype, d.kv_bytes_per_token))
                wait_no_blocks_in_use(self, c)
            finally:
                self.assertEqual(c.stop(), [0] * 3)

    def test_workers_with_different_kv_dtypes_refuse_to_pair(self):
        # The router refuses a worker whose pool dtype is not its --kv-dtype (as a block size)...
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, prefill_args=("--kv-dtype", "int4"),
                            decode_args=("--kv-dtype", "int8"), router_args=("--kv-dtype", "int8"))
        try:
            admin = worker_pb2_grpc.RouterAdminStub(grpc.insecure_channel(c.router.grpc))
            stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
            self.assertTrue(stats.prefill[0].refused)
            self.assertFalse(stats.decode[0].refused)
            ids = prompts(1, 42, 100, 101)[0]
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            same_as_local(self, collect(stub, request(ids)), local(ids, extra=("--kv-dtype", "int8")))
            # ...and a decode worker sent to it anyway is refused by the prefill worker, naming
            # both dtypes, and prefills locally: the request still completes, nothing leaks.
            decode = worker_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(c.decode[0].grpc))
            ids = prompts(1, 43, 100, 101)[0]  # Not cached on the decode worker.
            req = worker_pb2.DecodeRequest(request_id="direct", prompt_ids=ids, seed=1,
                                           prefill_address=c.prefill[0].grpc,
                                           sampling=pb.SamplingParams(max_tokens=4, temperature=0))
            got = [t for r in decode.Generate(req, timeout=60) for t in r.token_ids]
            self.assertEqual(got, local(ids, 4, extra=("--kv-dtype", "int8"))["token_ids"])
            d = info(c.decode[0], False)
            self.assertEqual((d.transfer_failures, d.local_prefills >= 2), (1, True))
            wait_no_blocks_in_use(self, c)
        finally:
            self.assertEqual(c.stop(), [0] * 3)
        self.assertIn("kv_dtype is int4 here but int8 on the peer", c.decode[0].stderr())
        self.assertIn("its KV cache dtype is int4, this router's is int8", c.router.stderr())

    def test_speculative_decoding_equals_plain_through_the_tiers(self):
        # Decode workers that speculate (n-gram drafts from each request's own tokens): every
        # request, greedy or seeded with penalties, streams the ids, logprobs and text that plain
        # decoding gives: greedy ones against `generate` in another process, seeded ones against
        # the same request with speculation turned off for it (num_speculative_tokens 0).
        rng = random.Random(5)
        ps = []
        for n in range(12):  # Prompts that repeat themselves with small edits, and plain ones.
            phrase = [rng.randrange(3, 500) for _ in range(rng.randrange(6, 20))]
            p = phrase * 3 + phrase[:3] if n % 3 else [rng.randrange(3, 500) for _ in range(40)]
            p[len(phrase) + 1] = 7
            ps.append(p)
        for method in ("ngram", "suffix"):
            with self.subTest(method=method):
                self.speculative_cluster_equals_plain(method, ps)

    def speculative_cluster_equals_plain(self, method, ps):
        c = cluster.Cluster(PDSERVE, MODEL, prefill=2, decode=2,
                            decode_args=("--speculative", method, "--num-speculative-tokens", "4",
                                         "--spec-ngram-min", "1",
                                         # Drafts counted below: not left to this machine's step times.
                                         "--spec-step-budget=false"))
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            greedy = [request(p, 40) for p in ps]
            seeded = [request(p, 40, temperature=0.9, top_p=0.95, seed=500 + i, frequency_penalty=0.3)
                      for i, p in enumerate(ps)]
            plain = []
            for r in seeded:
                q = pb.GenerateRequest()
                q.CopyFrom(r)
                q.sampling.num_speculative_tokens = 0
                plain.append(q)
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                got = list(pool.map(lambda r: collect(stub, r), greedy + seeded + plain))
            want = [local(p, 40) for p in ps]
            for g, w in zip(got[:12], want):
                same_as_local(self, g, w)
            for g, w in zip(got[12:24], got[24:]):
                self.assertEqual((g["token_ids"], g["logprobs"], g["top"], g["text"]),
                                 (w["token_ids"], w["logprobs"], w["top"], w["text"]))
            decodes = [info(d, False) for d in c.decode]
            self.assertGreater(sum(i.remote_prefills for i in decodes), 0)
            accepted = sum(i.spec_accepted_tokens for i in decodes)
            drafted = sum(i.spec_draft_tokens for i in decodes)
            self.assertGreater(accepted, 0)
            self.assertGreater(drafted, accepted)
            self.assertEqual(sum(sum(i.spec_accepted_by_position) for i in decodes), accepted)
            self.assertEqual([len(i.spec_accepted_by_position) for i in decodes], [4, 4])
            # Stop strings are cut by the router: a stream that speculates stops at the same token
            # (tokens that arrived with it are neither returned nor counted).
            stopped = 0
            for i, w in enumerate(want):
                if len(w["text"]) < 30:
                    continue
                stop = w["text"][12 + i % 5:16 + i % 5]
                pair = []
                for k in (None, 0):
                    r = request(ps[i], 40, stop=[stop])
                    if k is not None:
                        r.sampling.num_speculative_tokens = k
                    pair.append(collect(stub, r))
                self.assertEqual(pair[0]["finish_reason"], "stop")
                self.assertEqual((pair[0]["token_ids"], pair[0]["text"], pair[0]["usage"].completion_tokens),
                                 (pair[1]["token_ids"], pair[1]["text"], pair[1]["usage"].completion_tokens))
                self.assertEqual(pair[0]["text"], w["text"][:w["text"].find(stop)])
                stopped += 1
            self.assertGreater(stopped, 3)
            # A request asking for more drafts than the worker allows is fine (capped); out of
            # range is refused by the router, naming the field.
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(request([5, 6, 7], 3, num_speculative_tokens=17), timeout=10))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("num_speculative_tokens", e.exception.details())
            wait_no_blocks_in_use(self, c)
        finally:
            self.assertEqual(c.stop(), [0] * 5)

    def test_lagging_streams_fold_their_steps_and_clients_get_what_they_asked_for(self):
        # The decode worker's stream writes each held 300 ms (PDSERVE_FAULT_GRPC_DELAY_WRITES_MS, a
        # fault injected for the test): what the engine makes meanwhile waits, and the worker
        # folds it into one message that says how many tokens each step made (step_tokens). The
        # router, whose shared GenerateMany stream lags the same way (several steps' items a
        # message), still gives a client one message a step. With --stream-interval 4 (serve), 4
        # tokens a message, and a client whose writes lag (PDSERVE_FAULT_GRPC_DELAY_CLIENT_WRITES_MS)
        # gets what it missed in one. Outputs equal `generate` in another process.
        ps = prompts(3, 11, 8, 40)
        want = [local(p, 32) for p in ps]
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1,
                            decode_env=[{"PDSERVE_FAULT_GRPC_DELAY_WRITES_MS": "300"}])
        try:
            # The decode worker's own stream (the router's view of it).
            decode = worker_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(c.decode[0].grpc))
            for i, (p, w) in enumerate(zip(ps, want)):
                d = worker_pb2.DecodeRequest(request_id=f"lag{i}", prompt_ids=p, seed=1,
                                             sampling=pb.SamplingParams(temperature=0, max_tokens=32,
                                                                        ignore_eos=True, logprobs=2))
                messages = list(decode.Generate(d, timeout=60))
                ids = [t for m in messages for t in m.token_ids]
                self.assertEqual(ids, w["token_ids"])
                for m in messages:
                    if m.step_tokens:
                        self.assertEqual(sum(m.step_tokens), len(m.token_ids))
                self.assertTrue(any(len(m.step_tokens) > 1 for m in messages),
                                [len(m.token_ids) for m in messages])
                self.assertLess(len(messages), 32)
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            for p, w in zip(ps, want):
                messages = list(stub.Generate(request(p, 32), timeout=60))
                self.assertEqual([len(m.token_ids) for m in messages], [1] * 32)
                same_as_local(self, collect(stub, request(p, 32)), w)
            wait_no_blocks_in_use(self, c)
        finally:
            self.assertEqual(c.stop(), [0] * 3)
        # serve, whose router reaches its workers in-process.
        serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0",
                                          "--threads", "1", "--kv-memory-gib", "0.05",
                                          "--stream-interval", "4"],
                                env={"PDSERVE_FAULT_GRPC_DELAY_CLIENT_WRITES_MS": "300"})
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(serve.grpc))
            for p, w in zip(ps, want):
                messages = list(stub.Generate(request(p, 32), timeout=60))
                sizes = [len(m.token_ids) for m in messages]
                self.assertEqual(sum(sizes), 32)
                self.assertTrue(all(n >= 4 for n in sizes[:-1]), sizes)
                self.assertTrue(any(n > 4 for n in sizes), sizes)
                same_as_local(self, collect(stub, request(p, 32)), w)
            # A stop string still cuts where one token a message would.
            text = want[0]["text"]
            stop = text[10:13]
            got = collect(stub, request(ps[0], 32, stop=[stop]))
            self.assertEqual(got["text"], text[:text.find(stop)])
            self.assertEqual(got["finish_reason"], "stop")
        finally:
            self.assertEqual(serve.stop(), 0)

    def test_bad_input_is_invalid_argument_naming_the_field(self):
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1)
        try:
            channel = grpc.insecure_channel(c.router.grpc)
            stub = pbg.GenerationStub(channel)
            cases = [
                (pb.GenerateRequest(text="", sampling=pb.SamplingParams(max_tokens=4)), "prompt.text"),
                (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[]), sampling=pb.SamplingParams()), "prompt.token_ids"),
                (pb.GenerateRequest(sampling=pb.SamplingParams()), "prompt"),
                (request([7] * 5000), "prompt"),
                (request([7, 8], max_tokens=0), "sampling.max_tokens"),
                (request([7, 8], max_tokens=10 ** 9), "sampling.max_tokens"),
                (request([7, 8], top_p=1.5), "sampling.top_p"),
                (request([7, 8], top_p=0), "sampling.top_p"),
                (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2]),
                                    sampling=pb.SamplingParams(temperature=-1)), "sampling.temperature"),
                (request([1, 100000]), "prompt.token_ids"),
                (request([1, -3]), "prompt.token_ids"),
                (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2]),
                                    sampling=pb.SamplingParams(logprobs=50)), "sampling.logprobs"),
            ]
            for req, field in cases:
                with self.assertRaises(grpc.RpcError) as e:
                    list(stub.Generate(req, timeout=10))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, field)
                self.assertIn(field, e.exception.details())
            # Invalid UTF-8 cannot be built with the Python library: send the bytes raw
            # (field 2 "text", 3 bytes, the last one invalid).
            raw = channel.unary_stream("/pdserve.v1.Generation/Generate",
                                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
            with self.assertRaises(grpc.RpcError) as e:
                list(raw(b"\x12\x03ok\xff", timeout=10))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("UTF-8", e.exception.details())
            # "text" twice, the first copy not UTF-8 (found by the request fuzzer): refused, and
            # protobuf's own complaint does not reach the router's log (no log line per bad request).
            with self.assertRaises(grpc.RpcError) as e:
                list(raw(b"\x12\x01\xff\x12\x02ok", timeout=10))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertNotIn("libprotobuf", c.router.stderr())
            # Nothing crashed, nothing leaked, and the service still works.
            self.assertEqual(len(collect(stub, request([5, 6, 7], 3))["token_ids"]), 3)
            wait_no_blocks_in_use(self, c)
        finally:
            self.assertEqual(c.stop(), [0] * 3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_e2e_")
    MODEL = os.path.join(WORKDIR, "model")
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "llama", "--layers", str(LAYERS),
                    "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--seed", "3"],
                   check=True, capture_output=True)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
