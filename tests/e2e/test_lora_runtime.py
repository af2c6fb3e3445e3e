"""LoRA adapters changed while serving, and routed by where they are loaded:

- POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's endpoints, behind the API key,
  present only with --enable-lora-runtime-updates) on `serve` and on a router in front of separate
  tiers: an adapter loaded at run time answers as a local `pdserve generate` with the same files;
  every worker of both tiers gets it, a worker that joins later too; bad loads are refused naming
  the field or file and change nothing; an unload lets the requests running with it finish.
- LoRA affinity: two decode workers holding at most 2 of 4 adapters (--max-cpu-loras 2), one random
  sequence of requests sent through kv_aware (which prefers a worker that holds the adapter) and
  through round_robin: kv_aware reads adapters from disk fewer times (the workers' own counters)
  and is no slower.

The adapters are random ones in PEFT's layout written with numpy (tests/reference/peft_adapter.py).

Run: /usr/bin/python3 tests/e2e/test_lora_runtime.py --pdserve build/pdserve
"""

import argparse
import json
import os
import random
import shutil
import statistics
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
from lora_util import SMALL  # noqa: E402
from peft_adapter import write_lora  # noqa: E402
import grpc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "models", "pdserve-demo")
PDSERVE = None
WORKDIR = None
ADAPTERS = {}  # name -> directory
API_KEY = "runtime-lora-key-0123"
AUTH = (("authorization", f"Bearer {API_KEY}"),)
PROMPT = list(range(100, 160))


def setUpModule():
    for name, seed, rank in (("a0", 1, 8), ("a1", 2, 16), ("a2", 3, 8), ("a3", 4, 8)):
        ADAPTERS[name] = os.path.join(WORKDIR, name)
        write_lora(ADAPTERS[name], MODEL, rank=rank, alpha=2 * rank, seed=seed, b_std=0.05)
    ADAPTERS["rank32"] = os.path.join(WORKDIR, "rank32")
    write_lora(ADAPTERS["rank32"], MODEL, rank=32, seed=5)
    with open(os.path.join(WORKDIR, "keys.txt"), "w") as f:
        f.write(API_KEY + "\n")


def local(ids, adapter="", max_tokens=12):
    """A local run with the adapter's files (served as `x`)."""
    return lora_util.local(PDSERVE, MODEL, ids, f"x={ADAPTERS[adapter]}" if adapter else "", "x" if adapter else "",
                           max_tokens)


def generate(address, ids, adapter="", max_tokens=12, auth=()):
    return lora_util.generate(address, ids, adapter, max_tokens, metadata=auth)


def http(address, path, body=None, key=API_KEY):
    """(status, body: parsed JSON, or the text when it is not JSON)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"http://{address}{path}", headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, data = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read().decode()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


def adapter_names(address, prefill=False):
    return [a.name for a in cluster.worker_info(address, prefill).lora_adapters]


class ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", *SMALL,
                                          "--http-listen", "127.0.0.1:0", "--enable-lora-runtime-updates",
                                          "--api-key-file", os.path.join(WORKDIR, "keys.txt"),
                                          "--lora-modules", f"a0={ADAPTERS['a0']}"])
        cls.http = cls.s.addresses["http"]

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def models(self):
        status, body = http(self.http, "/v1/models")
        self.assertEqual(status, 200)
        return {m["id"]: m.get("parent") for m in body["data"]}

    def load(self, name, path):
        return http(self.http, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload(self, name):
        return http(self.http, "/v1/unload_lora_adapter", {"lora_name": name})

    def test_a_loaded_adapter_answers_as_a_local_run_until_it_is_unloaded(self):
        self.assertEqual(self.load("late", ADAPTERS["a1"]), (200, "Success: LoRA adapter 'late' added successfully."))
        self.assertEqual(self.models()["late"], "pdserve-demo")  # At once: no wait for a load report.
        ids = [3] + PROMPT[:40]
        got = generate(self.s.grpc, ids, "late", auth=AUTH)
        want = local(ids, "a1")
        self.assertEqual(got["token_ids"], want["token_ids"])
        self.assertEqual(got["logprobs"], [float(x) for x in want["logprobs"]])
        status, body = http(self.http, "/v1/completions", {"model": "late", "prompt": ids, "max_tokens": 12,
                                                           "temperature": 0, "ignore_eos": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(self.unload("late"), (200, "Success: LoRA adapter 'late' removed successfully."))
        self.assertNotIn("late", self.models())
        status, body = http(self.http, "/v1/completions", {"model": "late", "prompt": ids, "max_tokens": 2})
        self.assertEqual((status, body["error"]["code"]), (404, "model_not_found"))
        status, body = self.unload("late")
        self.assertEqual(status, 404)
        self.assertEqual(body["error"]["message"], "The lora adapter 'late' cannot be found.")

    def test_the_same_files_under_another_name_share_the_prefix_and_other_files_do_not(self):
        # An adapter's KV blocks are keyed by what it computes, not its name.
        ids = [5] + PROMPT[:47]  # Three whole blocks of 16 before the last token.
        self.assertEqual(self.load("twin", ADAPTERS["a0"])[0], 200)
        self.assertEqual(self.load("a2", ADAPTERS["a2"])[0], 200)
        try:
            generate(self.s.grpc, ids, "a0", max_tokens=2, auth=AUTH)
            twin = generate(self.s.grpc, ids, "twin", max_tokens=2, auth=AUTH)
            self.assertEqual(twin["cached"], 32)
            self.assertEqual(twin["token_ids"], local(ids, "a0", max_tokens=2)["token_ids"])
            self.assertEqual(generate(self.s.grpc, ids, "a2", max_tokens=2, auth=AUTH)["cached"], 0)
        finally:
            self.assertEqual(self.unload("twin")[0], 200)
            self.assertEqual(self.unload("a2")[0], 200)

    def test_bad_loads_are_refused_naming_the_field_and_change_nothing(self):
        before = self.models()
        cases = [
            ({"lora_name": "a0", "lora_path": ADAPTERS["a2"]}, 400, "has already been loaded"),
            ({"lora_name": "pdserve-demo", "lora_path": ADAPTERS["a2"]}, 400, "base model"),
            ({"lora_name": "x"}, 400, "Both 'lora_name' and 'lora_path' must be provided."),
            ({"lora_path": ADAPTERS["a2"]}, 400, "Both 'lora_name' and 'lora_path' must be provided."),
            ({"lora_name": 7, "lora_path": ADAPTERS["a2"]}, 400, "'lora_name' must be a string"),
            ({"lora_name": "x" * 300, "lora_path": ADAPTERS["a2"]}, 400, "at most 256"),
            ({"lora_name": "x", "lora_path": os.path.join(WORKDIR, "missing")}, 404, "adapter_config.json"),
            ({"lora_name": "x", "lora_path": ADAPTERS["rank32"]}, 400, "--max-lora-rank 16"),
        ]
        for body, code, message in cases:
            status, got = http(self.http, "/v1/load_lora_adapter", body)
            self.assertEqual(status, code, (body, got))
            self.assertIn(message, got["error"]["message"], body)
            self.assertTrue(got["error"]["param"], got)
        status, got = http(self.http, "/v1/unload_lora_adapter", {})
        self.assertEqual(status, 400)
        self.assertIn("'lora_name' needs to be provided", got["error"]["message"])
        self.assertEqual(self.models(), before)
        self.assertEqual(generate(self.s.grpc, PROMPT[:9], "a0", auth=AUTH)["token_ids"],
                         local(PROMPT[:9], "a0")["token_ids"])

    def test_the_endpoints_need_the_api_key(self):
        status, body = http(self.http, "/v1/load_lora_adapter", {"lora_name": "k", "lora_path": ADAPTERS["a2"]},
                            key="")
        self.assertEqual(status, 401, body)
        self.assertEqual(http(self.http, "/v1/unload_lora_adapter", {"lora_name": "a0"}, key="wrong")[0], 401)
        self.assertIn("a0", self.models())
        self.assertNotIn("k", self.models())

    def test_an_unload_lets_the_requests_running_with_it_finish(self):
        self.assertEqual(self.load("brief", ADAPTERS["a3"])[0], 200)
        ids = PROMPT[:10]
        result = {}
        thread = threading.Thread(target=lambda: result.update(generate(self.s.grpc, ids, "brief", max_tokens=1500,
                                                                         auth=AUTH)))
        thread.start()
        from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc
        with grpc.insecure_channel(self.s.grpc) as channel:
            admin = worker_pb2_grpc.RouterAdminStub(channel)
            deadline = time.time() + 20
            while time.time() < deadline:  # Unloaded while it runs on the decode worker.
                stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10, metadata=AUTH)
                if stats.decode[0].info.running == 1:
                    break
                time.sleep(0.01)
        self.assertEqual(stats.decode[0].info.running, 1)
        self.assertEqual(self.unload("brief")[0], 200)
        thread.join()
        self.assertEqual(len(result["token_ids"]), 1500)
        self.assertEqual(result["token_ids"], local(ids, "a3", max_tokens=1500)["token_ids"])


class OffTest(unittest.TestCase):
    def test_without_the_flag_the_endpoints_do_not_exist_and_workers_refuse(self):
        s = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", *SMALL,
                                      "--http-listen", "127.0.0.1:0"])
        try:
            status, body = http(s.addresses["http"], "/v1/load_lora_adapter",
                                {"lora_name": "x", "lora_path": ADAPTERS["a0"]}, key="")
            self.assertEqual(status, 404, body)
            from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc
            with grpc.insecure_channel(s.grpc) as channel:
                with self.assertRaises(grpc.RpcError) as e:
                    worker_pb2_grpc.RouterAdminStub(channel).LoadLoraAdapter(
                        worker_pb2.LoadLoraAdapterRequest(lora_name="x", lora_path=ADAPTERS["a0"]), timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("--enable-lora-runtime-updates", e.exception.details())
        finally:
            self.assertEqual(s.stop(), 0)


class TiersTest(unittest.TestCase):
    def test_every_worker_of_both_tiers_gets_it_and_a_worker_that_joins_later_too(self):
        on = ["--enable-lora-runtime-updates"]
        prefill = cluster.Process(PDSERVE, ["prefill", "--listen", "127.0.0.1:0", "--model", MODEL, *SMALL, *on])
        d1 = cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL, *SMALL, *on,
                                       "--local-prefill-tokens", "4", "--metrics-listen", "127.0.0.1:0"])
        late_port = cluster.free_port()
        router = cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                           "--http-listen", "127.0.0.1:0", *on, "--worker-wait-seconds", "1",
                                           "--prefill", prefill.grpc, "--decode", f"{d1.grpc},127.0.0.1:{late_port}",
                                           "--local-prefill-tokens", "4"])
        web = router.addresses["http"]
        procs = [router, d1, prefill]
        try:
            # Serving no adapter yet but taking them, it exports lora_requests_info already.
            with urllib.request.urlopen(f"http://{d1.addresses['metrics']}/metrics", timeout=10) as r:
                series = [line for line in r.read().decode().splitlines()
                          if line.startswith("pdserve_lora_requests_info{")]
            self.assertEqual(len(series), 1, series)
            self.assertIn('running_lora_adapters=""', series[0])
            status, body = http(web, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": ADAPTERS["a1"]},
                                key="")
            self.assertEqual(status, 200, body)
            self.assertEqual(adapter_names(d1.grpc), ["late"])
            self.assertEqual(adapter_names(prefill.grpc, True), ["late"])
            ids = [9] + PROMPT
            got = generate(router.grpc, ids, "late")
            self.assertEqual(got["token_ids"], local(ids, "a1")["token_ids"])
            self.assertEqual(cluster.worker_info(d1.grpc, False).remote_prefills, 1)
            # A decode worker that was away: the router sends it what was loaded meanwhile.
            d2 = cluster.Process(PDSERVE, ["decode", "--listen", f"127.0.0.1:{late_port}", "--model", MODEL,
                                           *SMALL, *on])
            procs.append(d2)
            deadline = time.time() + 20
            while adapter_names(d2.grpc) != ["late"] and time.time() < deadline:
                time.sleep(0.1)
            self.assertEqual(adapter_names(d2.grpc), ["late"])
            # A worker that takes no runtime changes: the load fails naming it and is undone.
            off = cluster.Process(PDSERVE, ["prefill", "--listen", "127.0.0.1:0", "--model", MODEL, *SMALL])
            procs.append(off)
            router2 = cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                                "--http-listen", "127.0.0.1:0", *on, "--prefill", off.grpc,
                                                "--decode", d1.grpc])
            procs.append(router2)
            status, body = http(router2.addresses["http"], "/v1/load_lora_adapter",
                                {"lora_name": "more", "lora_path": ADAPTERS["a2"]}, key="")
            self.assertEqual(status, 400, body)
            self.assertIn(f"prefill worker {off.grpc}", body["error"]["message"])
            self.assertIn("--enable-lora-runtime-updates", body["error"]["message"])
            self.assertEqual(adapter_names(d1.grpc), ["late"])
            # Unloaded through the first router: gone from every worker it knows.
            self.assertEqual(http(web, "/v1/unload_lora_adapter", {"lora_name": "late"}, key="")[0], 200)
            for address, is_prefill in ((d1.grpc, False), (d2.grpc, False), (prefill.grpc, True)):
                self.assertEqual(adapter_names(address, is_prefill), [], address)
        finally:
            codes = [p.stop() for p in reversed(procs)]
        self.assertEqual(codes, [0] * len(procs))


class AffinityTest(unittest.TestCase):
    """The same random requests over 4 adapters through each policy, each on two fresh workers; the
    two setups run side by side, request by request, so the machine's load is the same for both."""

    def setup(self, policy):
        modules = ",".join(f"{n}={ADAPTERS[n]}" for n in ("a0", "a1", "a2", "a3"))
        workers = [cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL, *SMALL,
                                             "--lora-modules", modules, "--max-cpu-loras", "2"])
                   for _ in range(2)]
        router = cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                           "--decode", ",".join(w.grpc for w in workers), "--policy", policy])
        return router, workers

    def test_kv_aware_prefers_workers_holding_the_adapter(self):
        rng = random.Random(7)
        sequence = [rng.choice(["a0", "a1", "a2", "a3"]) for _ in range(40)]
        setups = {policy: self.setup(policy) for policy in ("round_robin", "kv_aware")}
        try:
            start = {p: [cluster.worker_info(w.grpc, False).lora_loads for w in ws] for p, (_, ws) in setups.items()}
            latencies = {p: [] for p in setups}
            for i, adapter in enumerate(sequence):
                ids = [i % 50 + 1] + PROMPT[:20]
                for policy in (("round_robin", "kv_aware") if i % 2 == 0 else ("kv_aware", "round_robin")):
                    t = time.perf_counter()
                    got = generate(setups[policy][0].grpc, ids, adapter, max_tokens=4)
                    latencies[policy].append(time.perf_counter() - t)
                    self.assertEqual(len(got["token_ids"]), 4)
            loads = {p: sum(cluster.worker_info(w.grpc, False).lora_loads - s for w, s in zip(ws, start[p]))
                     for p, (_, ws) in setups.items()}
            split = {p: [cluster.worker_info(w.grpc, False).local_prefills for w in ws] for p, (_, ws) in setups.items()}
        finally:
            codes = [p.stop() for router, workers in setups.values() for p in [router] + workers]
        self.assertEqual(codes, [0] * 6)
        p50 = {p: statistics.median(v) for p, v in latencies.items()}
        print(f"\nadapter loads: round_robin {loads['round_robin']} (requests per worker {split['round_robin']}, "
              f"p50 {p50['round_robin'] * 1000:.1f} ms), kv_aware {loads['kv_aware']} ({split['kv_aware']}, "
              f"p50 {p50['kv_aware'] * 1000:.1f} ms)", file=sys.stderr)
        self.assertGreaterEqual(loads["round_robin"], 10)
        self.assertLessEqual(loads["kv_aware"], 6)
        self.assertTrue(all(n > 0 for n in split["kv_aware"]), split)  # Both workers serve.
        # Same latency: loading is the slower path, so affinity is no slower (2-core noise allowed).
        self.assertLess(p50["kv_aware"], p50["round_robin"] * 1.5 + 0.005)


class RetryTest(unittest.TestCase):
    def test_a_worker_with_no_room_for_the_adapter_is_retried_on_another(self):
        # --max-cpu-loras 1: a worker running a request of a0 cannot load a1 (RESOURCE_EXHAUSTED);
        # round robin sends the third request there, and the router continues it on the other.
        modules = f"a0={ADAPTERS['a0']},a1={ADAPTERS['a1']}"
        workers = [cluster.Process(PDSERVE, ["decode", "--listen", "127.0.0.1:0", "--model", MODEL, *SMALL,
                                             "--lora-modules", modules, "--max-cpu-loras", "1"])
                   for _ in range(2)]
        router = cluster.Process(PDSERVE, ["router", "--listen", "127.0.0.1:0", "--model", MODEL,
                                           "--decode", ",".join(w.grpc for w in workers), "--policy", "round_robin"])
        try:
            long_run = {}
            thread = threading.Thread(target=lambda: long_run.update(
                generate(router.grpc, PROMPT[:8], "a0", max_tokens=1500)))
            thread.start()
            deadline = time.time() + 20
            running = [0, 0]
            while sum(running) == 0 and time.time() < deadline:
                running = [cluster.worker_info(w.grpc, False).running for w in workers]
                time.sleep(0.01)
            self.assertEqual(sorted(running), [0, 1])
            other = workers[running.index(0)]
            self.assertEqual(generate(router.grpc, PROMPT[:6], "a1", max_tokens=2)["token_ids"],
                             local(PROMPT[:6], "a1", max_tokens=2)["token_ids"])
            got = generate(router.grpc, PROMPT[:7], "a1")
            self.assertEqual(got["token_ids"], local(PROMPT[:7], "a1")["token_ids"])
            from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc
            with grpc.insecure_channel(router.grpc) as channel:
                stats = worker_pb2_grpc.RouterAdminStub(channel).GetRouterStats(worker_pb2.GetRouterStatsRequest(),
                                                                                 timeout=10)
            self.assertEqual(stats.resumes, 1)
            self.assertEqual([w.decisions for w in stats.decode], [2, 2])
            self.assertEqual(cluster.worker_info(other.grpc, False).local_prefills, 2)
            thread.join()
            self.assertEqual(len(long_run["token_ids"]), 1500)
        finally:
            codes = [p.stop() for p in [router] + workers]
        self.assertEqual(codes, [0, 0, 0])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_lora_runtime_")
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
