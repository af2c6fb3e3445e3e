"""The router's policies on real processes: kv_aware against round_robin on a shared-prefix
workload (through `pdserve bench`, which starts a fresh cluster per policy), one shared system
prompt spread over every decode worker, and a worker with another KV layout refused."""

import argparse
import concurrent.futures
import json
import os
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
MODEL = None
WORKDIR = None

# Per-worker caches of 24 blocks (16 tokens each) against 12 system prompts of 4 blocks: one worker
# cannot hold them all, the tier can. round_robin shows every worker every prompt; kv_aware keeps
# each prompt on the workers that hold it.
BENCH = ["--prefill", "2", "--decode", "3", "--worker-flags", "--threads 1 --kv-blocks 24",
         "--workload", "shared-prefix", "--prefix-len", "64", "--input-len", "8", "--output-len", "4",
         "--request-rate", "25", "--format", "json"]


def bench(*args):
    out = subprocess.run([PDSERVE, "bench", "--model", MODEL, *BENCH, *args],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"pdserve bench failed ({out.returncode}): {out.stderr[-3000:]}")
    return {r["policy"]: r for r in json.loads(out.stdout)}


class RoutingTest(unittest.TestCase):
    def test_kv_aware_beats_round_robin_on_shared_prefixes(self):
        # A paired design over three seeds: each seed's workload runs under both policies. One
        # run's kv_aware hit rate depends on how arrivals race the workers' reports: 0.70-0.80
        # over seeds 5-10, idle or with both cores busy, round_robin 0.46-0.60 (the ceiling is
        # ~0.80). Each pair must favour kv_aware and the means differ by 0.15, four standard
        # deviations of a three-run mean's difference below the measured ~0.27. (Before the
        # share-of-traffic term, kv_aware measured 0.49-0.72 here and once lost a pair.)
        hits = {"round_robin": [], "kv_aware": []}
        for seed in ("5", "6", "7"):
            got = bench("--compare-policies", "round_robin,kv_aware", "--groups", "12",
                        "--num-prompts", "120", "--seed", seed)
            rr, kv = got["round_robin"], got["kv_aware"]
            for r in (rr, kv):
                self.assertEqual((r["ok"], r["failed"]), (120, 0), r)
                self.assertEqual(sum(r["decode_decisions"]), 120)
                hits[r["policy"]].append(r["hit_rate"])
            # The hit rate cannot pass 64/72 (the user part is never cached).
            self.assertLessEqual(kv["hit_rate"], 64 / 72)
            # round_robin spreads perfectly; kv_aware must stay near it.
            self.assertEqual(rr["decode_max_over_mean"], 1.0)
            self.assertLess(kv["decode_max_over_mean"], 1.5, got)
            self.assertGreater(kv["hit_rate"], rr["hit_rate"], got)
        rr_mean, kv_mean = (sum(hits[p]) / len(hits[p]) for p in ("round_robin", "kv_aware"))
        print(f"\n  hit rates: {hits}", file=sys.stderr)
        self.assertGreater(kv_mean, rr_mean + 0.15, hits)

    def test_one_shared_system_prompt_is_spread_over_every_worker(self):
        got = bench("--compare-policies", "kv_aware", "--groups", "1", "--num-prompts", "60",
                    "--seed", "6")["kv_aware"]
        self.assertEqual(got["failed"], 0)
        self.assertTrue(all(d > 0 for d in got["decode_decisions"]), got)
        self.assertLess(got["decode_max_over_mean"], 1.5, got)
        # And every worker still reuses the prompt it shares.
        self.assertGreater(got["hit_rate"], 0.6, got)

    def test_two_routers_do_not_herd(self):
        # Two routers over the same three decode workers, sampling (temperature) among near-best
        # workers; a burst sharing one system prompt, split between them, reaches every worker.
        workers = [cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL,
                                             "--threads", "1", "--kv-blocks", "64"]) for _ in range(3)]
        decode = ",".join(w.grpc for w in workers)
        routers = [cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                             "--decode", decode, "--routing-temperature", "0.5"])
                   for _ in range(2)]
        try:
            stubs = [pbg.GenerationStub(grpc.insecure_channel(r.grpc)) for r in routers]
            system = list(range(10, 74))

            def one(i):
                # Every client uses the same request_id: ids are the client's, not the workers' key.
                req = pb.GenerateRequest(request_id="dup",
                                         token_ids=pb.TokenIds(ids=system + [100 + i, 200 + i]),
                                         sampling=pb.SamplingParams(max_tokens=4, temperature=0))
                out = list(stubs[i % 2].Generate(req, timeout=60))
                self.assertEqual({r.request_id for r in out}, {"dup"})
                return sum(len(r.token_ids) for r in out)

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                self.assertEqual(list(pool.map(one, range(60))), [4] * 60)
            per_worker = []
            for w in workers:
                info = worker_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(w.grpc)).GetWorkerInfo(
                    worker_pb2.GetWorkerInfoRequest(), timeout=10)
                per_worker.append(info.local_prefills + info.remote_prefills)
            self.assertEqual(sum(per_worker), 60)
            self.assertTrue(all(n > 0 for n in per_worker), per_worker)
            self.assertLess(max(per_worker) * 3 / 60, 1.5, per_worker)
        finally:
            for r in routers:
                self.assertEqual(r.stop(), 0)
            for w in workers:
                w.stop()

    def test_worker_with_another_block_size_is_refused(self):
        good = cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL,
                                         "--threads", "1", "--kv-blocks", "64"])
        bad = cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL,
                                        "--threads", "1", "--kv-blocks", "64", "--block-size", "32"])
        router = cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                           "--decode", f"{bad.grpc},{good.grpc}"])
        try:
            admin = worker_pb2_grpc.RouterAdminStub(grpc.insecure_channel(router.grpc))
            stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
            by_address = {w.address: w for w in stats.decode}
            self.assertTrue(by_address[bad.grpc].refused)
            self.assertFalse(by_address[good.grpc].refused)
            self.assertEqual(stats.refused_workers, 1)
            stub = pbg.GenerationStub(grpc.insecure_channel(router.grpc))
            for i in range(4):
                req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=list(range(5 + i, 40 + i))),
                                         sampling=pb.SamplingParams(max_tokens=3, temperature=0))
                self.assertEqual(sum(len(r.token_ids) for r in stub.Generate(req, timeout=60)), 3)
            stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
            by_address = {w.address: w for w in stats.decode}
            self.assertEqual((by_address[good.grpc].decisions, by_address[bad.grpc].decisions), (4, 0))
        finally:
            self.assertEqual(router.stop(), 0)
            good.stop()
            bad.stop()
        log = router.stderr()
        self.assertIn("refusing decode worker " + bad.grpc, log)
        self.assertIn("block size 32", log)

    def test_dns_discovery_finds_the_workers(self):
        worker = cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL,
                                           "--threads", "1", "--kv-blocks", "64"])
        port = worker.grpc.rsplit(":", 1)[1]
        # localhost may also resolve to ::1, where nothing listens: that address stays unusable.
        router = cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                           "--decode", f"dns:///localhost:{port}",
                                           "--worker-wait-seconds", "3"])
        try:
            admin = worker_pb2_grpc.RouterAdminStub(grpc.insecure_channel(router.grpc))
            stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
            healthy = [w.address for w in stats.decode if w.healthy]
            self.assertEqual(healthy, [f"127.0.0.1:{port}"])
            stub = pbg.GenerationStub(grpc.insecure_channel(router.grpc))
            req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]),
                                     sampling=pb.SamplingParams(max_tokens=2, temperature=0))
            self.assertEqual(sum(len(r.token_ids) for r in stub.Generate(req, timeout=60)), 2)
        finally:
            self.assertEqual(router.stop(), 0)
            worker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_routing_")
    MODEL = os.path.join(WORKDIR, "model")
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "llama", "--layers", "2",
                    "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--seed", "4"],
                   check=True, capture_output=True)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
