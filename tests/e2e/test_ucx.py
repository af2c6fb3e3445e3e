"""The `ucx` KV transport end to end, as real processes on loopback, over UCX's TCP transport
(UCX_TLS=tcp) and its shared-memory transports (UCX_TLS=sm: posix, sysv and cma on this kernel).

- 2 prefill + 2 decode workers + router, 20 prompts: outputs bitwise equal to `generate --model`
  and to the same cluster over `--transport tcp`.
- Faults: a prefill worker killed mid-transfer (the decode worker falls back at once); a transfer
  stalled past its lease, whose late one-sided puts land after the decode worker gave the
  reservation up (the blocks stay quarantined until the sender flushed, while other requests fill
  the pool: their outputs prove no late put touched their blocks); a corrupted page; 64 cancels.
  No KV block stays in use after any of them.

Run: /usr/bin/python3 tests/e2e/test_ucx.py --pdserve build/pdserve
"""

import argparse
import concurrent.futures
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
import test_tiers  # noqa: E402  (its request/collect/local helpers)

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.v1 import generation_pb2_grpc as pbg  # noqa: E402

PDSERVE = None
WORKDIR = None
METRICS = ("--metrics-listen", "127.0.0.1:0")
TLS = ("tcp", "sm")


def ucx_cluster(tls, model=None, **kwargs):
    env = {**kwargs.pop("env", {}), "UCX_TLS": f"{tls},self"}
    return cluster.Cluster(PDSERVE, model or test_tiers.MODEL, transport="ucx", env=env, **kwargs)


def wide_model():
    return cluster.wide_model(PDSERVE, WORKDIR)


def wide_prompts(n, seed, length):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(length)] for _ in range(n)]


def wide_local(ids, max_tokens):
    return test_tiers.local(ids, max_tokens, extra=("--max-model-len", "256"), model=wide_model())


def info(process, prefill):
    return cluster.worker_info(process.grpc, prefill)


def idle(test, c, timeout=30):
    cluster.wait_idle(test, [(p, True) for p in c.prefill] + [(d, False) for d in c.decode], timeout)


class UcxTiersTest(unittest.TestCase):
    def test_disaggregated_equals_local_and_tcp(self):
        ps = test_tiers.prompts(20, 21)
        want = [test_tiers.local(p) for p in ps]
        results = {}
        for transport, tls in (("tcp", None), ("ucx", "tcp"), ("ucx", "sm")):
            if transport == "tcp":
                c = cluster.Cluster(PDSERVE, test_tiers.MODEL, prefill=2, decode=2)
            else:
                c = ucx_cluster(tls, prefill=2, decode=2)
            try:
                if transport == "ucx":
                    # The ready line names the UCX transports in use.
                    described = c.decode[0].addresses["transport"]
                    self.assertTrue(described.startswith("ucx("), described)
                    self.assertIn("tcp/" if tls == "tcp" else "memory", described)
                stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
                with concurrent.futures.ThreadPoolExecutor(8) as pool:
                    got = list(pool.map(lambda p: test_tiers.collect(stub, test_tiers.request(p)), ps))
                for g, w in zip(got, want):
                    test_tiers.same_as_local(self, g, w)
                decodes = [info(d, False) for d in c.decode]
                self.assertGreater(sum(i.remote_prefills for i in decodes), 10, (transport, tls))
                self.assertEqual(sum(i.transfers_completed for i in decodes),
                                 sum(i.remote_prefills for i in decodes), (transport, tls))
                self.assertEqual(sum(i.transfer_failures for i in decodes), 0, (transport, tls))
                idle(self, c)
                results[(transport, tls)] = got
            finally:
                self.assertEqual(c.stop(), [0] * 5)
        for key in (("ucx", "tcp"), ("ucx", "sm")):
            for g, t in zip(results[key], results[("tcp", None)]):
                self.assertEqual((g["token_ids"], g["logprobs"], g["top"]),
                                 (t["token_ids"], t["logprobs"], t["top"]), key)


class UcxFaultTest(unittest.TestCase):
    def test_prefill_worker_killed_mid_transfer(self):
        # "tcp-remote": every peer treated as on another host (test hook), so the dead sender is
        # found by UCX's own peer-failure detection (keepalive), not by watching its pid.
        for tls in TLS + ("tcp-remote",):
            with self.subTest(tls=tls):
                remote = {"PDSERVE_FAULT_UCX_REMOTE_PEERS": "1"} if tls == "tcp-remote" else {}
                c = ucx_cluster(tls.split("-")[0], prefill=1, decode=1, decode_args=METRICS, env=remote,
                                prefill_env={"PDSERVE_FAULT_STALL_KV_PAGE": "3:20000"})
                try:
                    stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
                    ids = test_tiers.prompts(1, 51, 100, 101)[0]
                    result = {}
                    t = threading.Thread(target=lambda: result.update(
                        test_tiers.collect(stub, test_tiers.request(ids, 12))))
                    start = time.time()
                    t.start()
                    deadline = time.time() + 20
                    while "fault injection: KV transfer" not in c.prefill[0].stderr():
                        self.assertLess(time.time(), deadline, "the transfer never stalled")
                        time.sleep(0.02)
                    c.prefill[0].proc.kill()  # Stalled with 2 pages put.
                    t.join(60)
                    # Every assertion says what the decode worker logged (a failure under load was
                    # seen once and could not be reproduced in 20 runs).
                    why = f"decode stderr: {c.decode[0].stderr()[-3000:]}"
                    self.assertLess(time.time() - start, 10, why)  # Not the 20 s stall, nor the lease.
                    self.assertEqual(len(result.get("token_ids", [])), 12, why)
                    test_tiers.same_as_local(self, result, test_tiers.local(ids, 12))
                    d = info(c.decode[0], False)
                    self.assertEqual((d.transfer_failures, d.transfers_completed), (1, 0), why)
                    # The dead sender's reservation is returned once its process is gone.
                    try:
                        cluster.wait_idle(self, [(c.decode[0], False)])
                    except AssertionError as e:
                        raise AssertionError(f"{e}; decode stderr: {c.decode[0].stderr()[-3000:]}") from None
                finally:
                    self.assertEqual(c.stop(), [0, 0, -9])

    def test_late_puts_after_the_lease_never_touch_another_requests_blocks(self):
        # The prefill worker freezes 2 s before its 2nd page; the lease is 1 s. The decode worker
        # gives the reservation up at 1 s and prefills the prompt itself, but the sender's late
        # puts still land when it wakes at 2 s. Six long requests were queued at the decode
        # worker before the lease expired, more than its 40 blocks hold: if the given-up blocks
        # went back to the free list at 1 s, the next queued request would take them (newest
        # free first) and be running when the late pages overwrite its KV, and its output would
        # differ from the local engine's. Quarantined, they return only after the sender flushed.
        # That the late puts were made and landed is read, not assumed: the sender logs its flush
        # after the stall, and the decode worker counts the reservation it returned only then.
        # (Checked: with the quarantine disabled, this test fails.)
        model = wide_model()
        for tls in TLS:
            with self.subTest(tls=tls):
                c = ucx_cluster(
                    tls, model, prefill=1, decode=1,
                    engine_args=("--threads", "1", "--kv-blocks", "40", "--max-model-len", "256"),
                    # No prefix cache: a freed block goes straight to the next request.
                    decode_args=METRICS + ("--lease-ms", "1000", "--local-prefill-tokens", "100",
                                           "--enable-prefix-caching", "false"),
                    router_args=("--local-prefill-tokens", "100"),
                    prefill_env={"PDSERVE_FAULT_STALL_KV_PAGE": "2:2000"})
                try:
                    stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
                    stalled = wide_prompts(1, 61, 150)[0]
                    others = wide_prompts(6, 62, 64)
                    result = {}
                    t = threading.Thread(target=lambda: result.update(
                        test_tiers.collect(stub, test_tiers.request(stalled, 4))))
                    t.start()
                    deadline = time.time() + 20
                    while "fault injection: KV transfer" not in c.prefill[0].stderr():
                        self.assertLess(time.time(), deadline, "the transfer never stalled")
                        time.sleep(0.02)
                    start = time.time()
                    # 64-token prompts are prefilled on the decode worker (no transfer), started
                    # just after the lease expired and the stalled prompt was prefilled here (its
                    # blocks freed again), and still generating when the sender wakes at 2 s.
                    def other(p):
                        time.sleep(max(0.0, start + 1.25 - time.time()))
                        return test_tiers.collect(stub, test_tiers.request(p, 180))
                    with concurrent.futures.ThreadPoolExecutor(6) as pool:
                        got = list(pool.map(other, others))
                    t.join(60)
                    test_tiers.same_as_local(self, result, wide_local(stalled, 4))
                    for g, p in zip(got, others):
                        test_tiers.same_as_local(self, g, wide_local(p, 180))
                    self.assertEqual(cluster.metric(c.decode[0], "pdserve_kv_lease_expired_total"), 1)
                    idle(self, c)
                    self.assertRegex(c.prefill[0].stderr(), r"fault injection: KV transfer \d+ flushed [1-9]\d* pages after its stall")
                    self.assertEqual(cluster.metric(c.decode[0], "pdserve_kv_quarantine_released_total"), 1)
                finally:
                    self.assertEqual(c.stop(), [0] * 3)

    def test_corrupted_page_is_refused_and_the_request_still_completes(self):
        for tls in TLS:
            with self.subTest(tls=tls):
                c = ucx_cluster(tls, prefill=1, decode=1,
                                prefill_env={"PDSERVE_FAULT_CORRUPT_KV_PAGE": "3"})
                try:
                    stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
                    ids = test_tiers.prompts(1, 5, 100, 101)[0]
                    test_tiers.same_as_local(self, test_tiers.collect(stub, test_tiers.request(ids)),
                                             test_tiers.local(ids))
                    d = info(c.decode[0], False)
                    self.assertEqual((d.transfer_failures, d.transfers_completed), (1, 0))
                    self.assertGreaterEqual(d.local_prefills, 1)
                    idle(self, c)
                finally:
                    c.stop()

    def test_64_cancels_leave_no_block_in_use(self):
        for tls in TLS:
            with self.subTest(tls=tls):
                c = ucx_cluster(tls, prefill=2, decode=2)
                try:
                    stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
                    ps = test_tiers.prompts(64, 8, 20, 160)

                    def cancel_at_random(k):
                        rng = random.Random(2000 + k)
                        call = stub.Generate(test_tiers.request(ps[k], 40))
                        after = rng.randrange(0, 6)
                        if after == 0:
                            time.sleep(rng.random() * 0.05)
                            call.cancel()
                            return
                        try:
                            for n, _ in enumerate(call):
                                if n + 1 >= after:
                                    call.cancel()
                                    break
                        except grpc.RpcError:
                            pass

                    with concurrent.futures.ThreadPoolExecutor(64) as pool:
                        list(pool.map(cancel_at_random, range(64)))
                    idle(self, c)
                    # And the cluster still serves.
                    ids = ps[0]
                    test_tiers.same_as_local(self, test_tiers.collect(stub, test_tiers.request(ids)),
                                             test_tiers.local(ids))
                finally:
                    self.assertEqual(c.stop(), [0] * 5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    test_tiers.PDSERVE = PDSERVE
    WORKDIR = workdir = tempfile.mkdtemp(prefix="pdserve_ucx_")
    test_tiers.MODEL = os.path.join(workdir, "model")
    subprocess.run([PDSERVE, "make-model", test_tiers.MODEL, "--arch", "llama", "--layers",
                    str(test_tiers.LAYERS), "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                    "--vocab", "512", "--seed", "3"], check=True, capture_output=True)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
