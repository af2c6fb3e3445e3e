"""KV cache tiers on real processes (issue 59, the disk tier): `serve --kv-offload-disk DIR` keeps
the prefix blocks it publishes in DIR; a second `serve` on the same directory (a restarted worker:
an empty pool) loads them instead of computing them, and its outputs (ids and logprobs, greedy and
seeded, prompts prefilled on the decode worker and on the prefill worker) equal the first run's
bit for bit. The tier's metrics say what moved. A directory that cannot be used is refused by name.

The shared store (`--kv-store redis://...`, a real redis-server with a password and an HMAC key):
separate prefill, decode and router processes load what an earlier set computed, with equal outputs;
a second serve process, running beside the first, loads the prefixes the first computed with the
same outputs; with the store killed or slower than the timeout, requests are computed as before
(equal outputs, bounded latency, the errors counted); a store out of reach at start is served
without and used once up; one that refuses the password, or a misnamed one, is refused by name.

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


def serve(tier, *extra, local_prefill_tokens=24):
    disk = ["--kv-offload-disk", tier, "--kv-offload-disk-gib", "0.5"] if tier else []
    return cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                     "--block-size", "4", "--kv-blocks", "48",
                                     "--local-prefill-tokens", str(local_prefill_tokens),
                                     "--metrics-listen", "127.0.0.1:0", *disk, *extra])


free_port = cluster.free_port
Redis = cluster.RedisServer


def store_with_password(name):
    """A redis-server requiring the password `name`-pw, and the flags that reach it (the password in
    a file, as --kv-store-password-file reads it)."""
    redis = Redis(f"{name}-pw")
    pw_file = os.path.join(WORKDIR, f"pw_{name}")
    with open(pw_file, "w") as f:
        f.write(redis.password)
    return redis, ("--kv-store", f"redis://127.0.0.1:{redis.port}", "--kv-store-password-file", pw_file)


class SlowProxy:
    """A TCP proxy in front of a Redis server; with `delay` > 0 it holds every reply that long
    (a store slowed past the workers' timeout, as by a saturated network or a stalled server)."""

    def __init__(self, target_port):
        import socket
        import threading
        self.delay = 0.0
        self.target = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src, dst, replies):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if replies and self.delay > 0:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def close(self):
        self.closed = True
        self.listener.close()


def wait_stored_in(process, tier, roles=("prefill", "decode")):
    last, deadline = -1, time.time() + 30
    while time.time() < deadline:
        now = sum(cluster.metric(process, "pdserve_kv_offload_store_bytes_total", role=r, tier=tier) for r in roles)
        if now == last and now > 0:
            return now
        last = now
        time.sleep(0.5)
    raise AssertionError("the tier's stores did not settle")


def tls_certs():
    """A CA and the redis-server's certificate it signed (node), a client's (client), one naming
    another host (elsewhere), and a rogue CA."""
    certs = os.path.join(WORKDIR, "certs")
    if not os.path.exists(os.path.join(certs, "client.pem")):
        os.makedirs(certs, exist_ok=True)
        for ca in ("ca", "rogue"):
            cluster.make_ca(certs, ca)
        for leaf in ("node", "client"):
            cluster.make_leaf(certs, leaf, "ca")
        cluster.make_leaf(certs, "elsewhere", "ca", names="DNS:elsewhere.example")
    return certs


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
    return tier_metric_of(process, name, role, "disk")


def tier_metric_of(process, name, role, tier):
    return cluster.metric(process, name, role=role, tier=tier)


def tier_total(process, name, tier):
    """`name` of `tier` summed over serve's two workers."""
    return sum(tier_metric_of(process, name, r, tier) for r in ("prefill", "decode"))


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
    def assert_serve_refuses(self, args, what):
        """`serve` with `args` exits at start with the usage status, its error naming `what`."""
        r = subprocess.run([PDSERVE, "serve", "--model", MODEL, "--listen", "127.0.0.1:0", *args],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(what, r.stderr)

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
        # The router counts what the tier holds as cached, and here it holds nearly every prompt
        # whole: with --local-prefill-tokens 0 a prompt with anything left to compute still goes to
        # the prefill worker, so both workers' loads are exercised.
        second = serve(tier, local_prefill_tokens=0)
        try:
            got = run(second)
            self.assertEqual(got, want, "outputs with prefixes from the tier differ from computing them")
            loaded = sum(cluster.metric(second, "pdserve_kv_offload_loaded_blocks_total", role=r)
                         for r in ("prefill", "decode"))
            self.assertGreater(loaded, 0)
            # Both paths: prompts prefilled on the decode worker, and on the prefill worker.
            self.assertGreater(cluster.metric(second, "pdserve_kv_offload_loaded_tokens_total", role="decode"), 0)
            self.assertGreater(cluster.metric(second, "pdserve_kv_offload_loaded_tokens_total", role="prefill"), 0)
            self.assertEqual(sum(tier_metric(second, "pdserve_kv_offload_corrupt_blocks_total", r)
                                 for r in ("prefill", "decode")), 0)
        finally:
            self.assertEqual(second.stop(), 0)

    def test_a_second_server_loads_what_the_first_computed_from_the_shared_store(self):
        redis = Redis("pw-" + str(random.randrange(1 << 30)))
        pw_file = os.path.join(WORKDIR, "redis_password")
        key_file = os.path.join(WORKDIR, "kv_store_key")
        with open(pw_file, "w") as f:
            f.write("default:" + redis.password + "\n")
        with open(key_file, "w") as f:
            f.write("a shared secret of the deployment")
        store = ["--kv-store", f"redis://127.0.0.1:{redis.port}", "--kv-store-password-file", pw_file,
                 "--kv-store-key-file", key_file]
        procs = []
        try:
            first = serve(None, *store)
            procs.append(first)
            want = run(first)
            wait_stored_in(first, "redis")
            self.assertGreater(int(redis.cli("DBSIZE")), 0)
            self.assertTrue(redis.cli("KEYS", "pdkv:*"))
            # Beside it, a fresh server (an empty pool, no disk): every prefix comes from the store.
            second = serve(None, *store)
            procs.append(second)
            third = serve(None, *store)
            procs.append(third)
            self.assertEqual(run(second), want, "outputs with prefixes from the store differ from computing them")
            for r in ("prefill", "decode"):
                self.assertGreater(cluster.metric(second, "pdserve_kv_offload_loaded_tokens_total", role=r), 0, r)
                self.assertGreater(tier_metric_of(second, "pdserve_kv_offload_load_bytes_total", r, "redis"), 0)
                self.assertEqual(tier_metric_of(second, "pdserve_kv_offload_corrupt_blocks_total", r, "redis"), 0)
            # The store dies: the third server computes everything, with the same outputs.
            redis.kill()
            self.assertEqual(run(third), want, "outputs without the store differ")
            self.assertGreater(tier_total(third, "pdserve_kv_offload_errors_total", "redis"), 0)
            self.assertEqual(sum(cluster.metric(third, "pdserve_kv_offload_loaded_blocks_total", role=r)
                                 for r in ("prefill", "decode")), 0)
        finally:
            for p in procs:
                self.assertEqual(p.stop(), 0)
            redis.kill()

    def test_separate_prefill_and_decode_processes_load_from_the_store_with_the_same_outputs(self):
        redis, store = store_with_password("disagg")
        engine = ("--threads", "1", "--block-size", "4", "--kv-blocks", "48", *store)
        clusters = []
        try:
            first = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, engine_args=engine,
                                    prefill_args=("--metrics-listen", "127.0.0.1:0"),
                                    decode_args=("--metrics-listen", "127.0.0.1:0"), router_args=("--block-size", "4"))
            clusters.append(first)
            want = run(first.router)
            wait_stored_in(first.prefill[0], "redis", roles=("prefill",))
            # Fresh processes of both tiers: each loads the stored prefixes; the decode worker
            # asks the prefill worker only for the pages after those it loaded.
            second = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, engine_args=engine,
                                     prefill_args=("--metrics-listen", "127.0.0.1:0"),
                                     decode_args=("--metrics-listen", "127.0.0.1:0"), router_args=("--block-size", "4"))
            clusters.append(second)
            self.assertEqual(run(second.router), want, "disaggregated outputs with the store differ")
            self.assertGreater(cluster.metric(second.prefill[0], "pdserve_kv_offload_loaded_tokens_total",
                                              role="prefill"), 0)
            self.assertGreater(cluster.metric(second.decode[0], "pdserve_kv_offload_loaded_tokens_total",
                                              role="decode"), 0)
            sent = [cluster.metric(c.decode[0], "pdserve_kv_transfer_pages_total", role="decode") for c in clusters]
            self.assertGreater(sent[0], 0)
            self.assertLess(sent[1], sent[0], "the decode worker's pages loaded from the store were sent again")
            self.assertEqual(tier_metric_of(second.prefill[0], "pdserve_kv_offload_corrupt_blocks_total",
                                            "prefill", "redis"), 0)
        finally:
            for c in clusters:
                self.assertEqual(c.stop(), [0] * 3)
            redis.kill()

    def test_the_router_counts_the_stores_blocks_for_every_worker_with_the_store(self):
        """A prefix every pool has evicted but the shared store holds: the router knows it (the
        workers report what they wrote there), predicts the chosen decode worker loads it
        (pdserve_router_prompt_blocks_total{source="kv_tier"}) and so has it prefilled there (what
        is left to compute is short), and the worker does load it, with the output of computing it."""
        redis, store = store_with_password("route")
        metrics = ("--metrics-listen", "127.0.0.1:0")
        engine = ("--threads", "1", "--block-size", "4", "--kv-blocks", "48")
        plain = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, engine_args=engine,
                                router_args=("--block-size", "4"))
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=2, engine_args=engine + store,
                            prefill_args=metrics, decode_args=metrics, router_args=("--block-size", "4", *metrics))
        try:
            rng = random.Random(23)
            prefix = [rng.randrange(3, 500) for _ in range(40)]

            def ask(target, ids):
                stub = pbg.GenerationStub(grpc.insecure_channel(target.grpc))
                req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=pb.SamplingParams(
                    max_tokens=4, temperature=0, logprobs=1, ignore_eos=True))
                got = [(list(r.token_ids), list(r.logprobs)) for r in stub.Generate(req, timeout=120)]
                return [t for ids, _ in got for t in ids], [lp for _, lps in got for lp in lps]

            ask(c.router, prefix + [7, 8, 9])
            # Other prompts (32 x 11 blocks, however the router splits them) push the prefix out of
            # every 48-block pool.
            for i in range(32):
                ask(c.router, [rng.randrange(3, 500) for _ in range(42)])
            time.sleep(2.5)  # Past the router's event grace: its own recent decisions no longer count.
            before = cluster.metric(c.router, "pdserve_router_prompt_blocks_total", tier="decode", source="kv_tier")
            loaded = sum(cluster.metric(d, "pdserve_kv_offload_loaded_blocks_total", role="decode") for d in c.decode)
            local = cluster.metric(c.router, "pdserve_router_local_prefill_total")
            probe = prefix + [11, 12, 13]
            self.assertEqual(ask(c.router, probe), ask(plain.router, probe))
            self.assertGreaterEqual(cluster.metric(c.router, "pdserve_router_prompt_blocks_total", tier="decode",
                                                   source="kv_tier") - before, 10)
            # 43 tokens, 40 of them in the store: 3 to compute, under --local-prefill-tokens 4.
            self.assertEqual(cluster.metric(c.router, "pdserve_router_local_prefill_total") - local, 1)
            self.assertGreaterEqual(sum(cluster.metric(d, "pdserve_kv_offload_loaded_blocks_total", role="decode")
                                        for d in c.decode) - loaded, 10)
        finally:
            self.assertEqual(c.stop(), [0] * 4)
            self.assertEqual(plain.stop(), [0] * 3)
            redis.kill()

    def test_a_stream_resumed_on_another_decode_worker_loads_its_prefix_from_the_store(self):
        """A decode worker killed mid-stream: the router continues each broken stream on the other
        one, which loads the prompt and the output the first worker stored (the prompt's blocks from
        the prefill worker, the output's from the dead worker) instead of computing them, and every
        stream equals the fault-free run, token and logprob."""
        redis, store = store_with_password("resume")
        metrics = ("--metrics-listen", "127.0.0.1:0")
        # Room for every stream at once (16 x 90 blocks): a request is loaded from the store only
        # when its blocks are free at admission (else it is computed, as without a store).
        engine = ("--threads", "1", "--block-size", "4", "--kv-blocks", "2000")
        rng = random.Random(31)
        reqs = []
        for i in range(16):
            ids = [rng.randrange(3, 500) for _ in range(rng.randrange(30, 60))]
            sp = pb.SamplingParams(max_tokens=300, temperature=0 if i % 2 == 0 else 0.9, seed=500 + i, logprobs=1,
                                   ignore_eos=True)
            reqs.append(pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sp))

        def collect(target, req, on_token=None):
            stub = pbg.GenerationStub(grpc.insecure_channel(target.grpc))
            ids, lps = [], []
            for r in stub.Generate(req, timeout=120):
                ids += list(r.token_ids)
                lps += list(r.logprobs)
                if on_token and r.token_ids:
                    on_token(len(ids))
            return ids, lps

        plain = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, engine_args=engine,
                                router_args=("--block-size", "4"))
        try:
            want = [collect(plain.router, r) for r in reqs]
        finally:
            self.assertEqual(plain.stop(), [0] * 3)
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=2, engine_args=engine + store, decode_args=metrics,
                            router_args=("--block-size", "4", *metrics))
        victim, survivor = c.decode[0], c.decode[1]
        try:
            got, running = cluster.streams_with_a_killed_worker(
                self, lambda i, on_token: collect(c.router, reqs[i], on_token), len(reqs), victim,
                started_streams=8, started_tokens=8)
            self.assertGreater(running, 0)
            self.assertEqual(got, want, "resumed streams differ from the fault-free run")
            self.assertGreater(cluster.metric(c.router, "pdserve_router_resumes_total"), 0)
            self.assertGreater(cluster.metric(survivor, "pdserve_kv_offload_loaded_tokens_total", role="decode"), 0)
            self.assertEqual(tier_metric_of(survivor, "pdserve_kv_offload_corrupt_blocks_total", "decode", "redis"), 0)
        finally:
            self.assertEqual(c.stop(), [0, -9, 0, 0])
            redis.kill()

    def test_a_store_slower_than_the_timeout_costs_no_request_more_than_it(self):
        redis = Redis("slow-pw")
        proxy = SlowProxy(redis.port)
        with open(os.path.join(WORKDIR, "pw_slow"), "w") as f:
            f.write("slow-pw")
        pw = ["--kv-store-password-file", os.path.join(WORKDIR, "pw_slow")]
        procs = []
        try:
            first = serve(None, "--kv-store", f"redis://127.0.0.1:{redis.port}", *pw)
            procs.append(first)
            want = run(first)
            wait_stored_in(first, "redis")
            second = serve(None, "--kv-store", f"redis://127.0.0.1:{proxy.port}", "--kv-store-timeout-ms", "300", *pw)
            procs.append(second)
            proxy.delay = 3.0  # Every reply now comes 10x past the timeout.
            stub = pbg.GenerationStub(grpc.insecure_channel(second.grpc))
            got, slowest = [], 0.0
            for req in requests():
                start = time.time()
                ids, lps = [], []
                for r in stub.Generate(req, timeout=120):
                    ids += list(r.token_ids)
                    lps += list(r.logprobs)
                slowest = max(slowest, time.time() - start)
                got.append((ids, lps))
            self.assertEqual(got, want, "outputs with a slow store differ from computing them")
            # A load waits one timeout at most, then the connection is dropped and tried again a
            # second later (a store queued before a load adds at most one more timeout).
            self.assertLess(slowest, 2.5)
            self.assertGreater(tier_total(second, "pdserve_kv_offload_errors_total", "redis"), 0)
        finally:
            for p in procs:
                self.assertEqual(p.stop(), 0)
            proxy.close()
            redis.kill()

    def test_a_store_restarted_empty_is_filled_again_and_costs_only_its_hits(self):
        """The store restarts empty under a running server: requests are computed with the same
        outputs (the loads miss, the broken connection is an error, counted), and the server stores
        its blocks again rather than believing the store still holds what it wrote before."""
        redis, store = store_with_password("restart")
        p = serve(None, *store)
        try:
            want = run(p)
            wait_stored_in(p, "redis")
            self.assertGreater(int(redis.cli("DBSIZE")), 0)
            redis.kill()
            redis = Redis("restart-pw", redis.port)  # Same address, nothing in it.
            self.assertEqual(int(redis.cli("DBSIZE")), 0)
            self.assertEqual(run(p), want, "outputs after the store restarted empty differ")
            time.sleep(1.2)  # Past the reconnect backoff.
            self.assertEqual(run(p), want)
            wait_stored_in(p, "redis")
            self.assertGreater(int(redis.cli("DBSIZE")), 0, "the server never stored its blocks again")
            self.assertGreater(tier_total(p, "pdserve_kv_offload_errors_total", "redis"), 0)
            self.assertEqual(tier_total(p, "pdserve_kv_offload_corrupt_blocks_total", "redis"), 0)
        finally:
            self.assertEqual(p.stop(), 0)
            redis.kill()

    def test_a_full_disk_costs_only_its_hits(self):
        """The tier's file system fills up (a 64 KiB tmpfs, far below the byte budget): writes fail,
        counted, leaving no temporary file; requests complete with the outputs of a server without
        the tier; a restart on the full directory loads what fit."""
        full = os.path.join(WORKDIR, "full_disk")
        os.makedirs(full, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", full], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs to fill (needs CAP_SYS_ADMIN): {r.stderr.strip()}")
        procs = []
        try:
            plain = serve(None)
            procs.append(plain)
            want = run(plain)
            p = serve(full)
            procs.append(p)
            self.assertEqual(run(p), want, "outputs with a full disk differ")
            deadline = time.time() + 30
            while sum(tier_metric(p, "pdserve_kv_offload_errors_total", role) for role in ("prefill", "decode")) == 0:
                self.assertLess(time.time(), deadline, "no write failed: the disk never filled")
                time.sleep(0.2)
            self.assertEqual(p.stop(), 0)
            procs.remove(p)
            names = os.listdir(full)
            self.assertFalse([n for n in names if n.endswith(".tmp")], "a failed write left its temporary file")
            self.assertTrue([n for n in names if n.endswith(".kvb")], "nothing fit")
            again = serve(full)
            procs.append(again)
            self.assertEqual(run(again), want, "outputs after a restart on the full disk differ")
            self.assertGreater(sum(cluster.metric(again, "pdserve_kv_offload_loaded_blocks_total", role=role)
                                   for role in ("prefill", "decode")), 0)
        finally:
            for proc in procs:
                self.assertEqual(proc.stop(), 0)
            subprocess.run(["umount", full], capture_output=True)

    def test_a_store_refusing_the_password_or_misnamed_is_refused_at_start(self):
        redis = Redis("right-password")
        try:
            pw_file = os.path.join(WORKDIR, "wrong_password")
            with open(pw_file, "w") as f:
                f.write("wrong-password")
            for args, what in ((["--kv-store", f"redis://127.0.0.1:{redis.port}", "--kv-store-password-file", pw_file],
                                "AUTH: "),
                               (["--kv-store", "redis://nohostport"], "is not HOST:PORT"),
                               (["--kv-store-key-file", pw_file], "need --kv-store")):
                self.assert_serve_refuses(args, what)
        finally:
            redis.kill()

    def test_a_tls_store_carries_prefixes_between_servers_with_the_same_outputs(self):
        # A redis-server speaking TLS only and requiring client certificates: a second serve loads
        # what the first computed through it, with equal outputs.
        certs = tls_certs()
        redis = Redis("tls-pw", tls_certs=certs, tls_auth_clients=True)
        try:
            pw_file = os.path.join(WORKDIR, "pw_tls")
            with open(pw_file, "w") as f:
                f.write(redis.password)
            store = ("--kv-store", redis.url, "--kv-store-password-file", pw_file,
                     "--kv-store-tls-ca", os.path.join(certs, "ca.pem"),
                     "--kv-store-tls-cert", os.path.join(certs, "client.pem"),
                     "--kv-store-tls-key", os.path.join(certs, "client.key"))
            first = serve(None, *store)
            try:
                want = run(first)
                wait_stored_in(first, "redis")
            finally:
                self.assertEqual(first.stop(), 0)
            self.assertGreater(int(redis.cli("DBSIZE")), 0)
            second = serve(None, *store)
            try:
                self.assertEqual(run(second), want, "outputs with prefixes over TLS differ from computing them")
                self.assertGreater(tier_total(second, "pdserve_kv_offload_load_bytes_total", "redis"), 0)
                self.assertEqual(tier_total(second, "pdserve_kv_offload_corrupt_blocks_total", "redis"), 0)
            finally:
                self.assertEqual(second.stop(), 0)
        finally:
            redis.kill()

    def test_a_tls_store_that_does_not_verify_is_refused_by_name(self):
        certs = tls_certs()
        redis = Redis(tls_certs=certs)
        misnamed = Redis(tls_certs=certs, tls_leaf="elsewhere")
        try:
            for args, what in (
                    # Its certificate is signed by a CA the worker does not trust.
                    (["--kv-store", redis.url, "--kv-store-tls-ca", os.path.join(certs, "rogue.pem")],
                     "TLS handshake failed: the server's certificate"),
                    # The CA's, but for another host than the one asked for.
                    (["--kv-store", misnamed.url, "--kv-store-tls-ca", os.path.join(certs, "ca.pem")],
                     "TLS handshake failed: the server's certificate: IP address mismatch"),
                    (["--kv-store", redis.url, "--kv-store-tls-ca", os.path.join(certs, "missing.pem")],
                     "--kv-store-tls-ca: cannot load"),
                    (["--kv-store", redis.url, "--kv-store-tls-cert", os.path.join(certs, "client.pem")],
                     "--kv-store-tls-cert and --kv-store-tls-key go together"),
                    (["--kv-store", f"redis://127.0.0.1:{redis.port}", "--kv-store-tls-ca", os.path.join(certs, "ca.pem")],
                     "need a rediss:// --kv-store")):
                self.assert_serve_refuses(args, what)
        finally:
            redis.kill()
            misnamed.kill()

    def test_a_store_out_of_reach_at_start_is_served_without_and_used_once_up(self):
        port = free_port()
        with open(os.path.join(WORKDIR, "pw_later"), "w") as f:
            f.write("later-pw")
        store = ["--kv-store", f"redis://127.0.0.1:{port}", "--kv-store-password-file",
                 os.path.join(WORKDIR, "pw_later")]
        p = serve(None, *store)
        redis = None
        try:
            self.assertIn(f"--kv-store: redis 127.0.0.1:{port}:", p.stderr())
            self.assertIn("serving without it", p.stderr())
            want = run(p)  # Served without the store: computed.
            redis = Redis("later-pw", port)
            time.sleep(1.2)  # Past the retry backoff.
            stub = pbg.GenerationStub(grpc.insecure_channel(p.grpc))
            ids = list(range(7, 7 + 40))
            for _ in stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids),
                                                      sampling=pb.SamplingParams(max_tokens=2)), timeout=60):
                pass
            wait_stored_in(p, "redis")
            self.assertGreater(int(redis.cli("DBSIZE")), 0)
            self.assertEqual(run(p), want)
        finally:
            self.assertEqual(p.stop(), 0)
            if redis:
                redis.kill()

    def test_the_host_tier_gives_back_evicted_prefixes_with_the_same_outputs(self):
        # serve's prefill and decode engines share one host tier: a second pass over prefixes the
        # 48-block pools evicted loads them from host memory, with the outputs of computing them.
        plain = serve(None)
        try:
            want = run(plain)
        finally:
            self.assertEqual(plain.stop(), 0)
        host = serve(None, "--kv-offload-host-gib", "0.25", "--metrics-compat", "vllm")
        try:
            self.assertEqual(run(host), want, "the first pass (storing) differs from computing")
            wait_stored_in(host, "host")
            self.assertEqual(run(host), want, "outputs with prefixes from the host tier differ from computing")
            loaded = tier_total(host, "pdserve_kv_offload_load_bytes_total", "host")
            self.assertGreater(loaded, 0)
            # vLLM's prompt_tokens_cached_by_source: the host tier's tokens are the loaded ones.
            for name in ("pdserve_prompt_tokens_cached_by_source_total", "vllm:prompt_tokens_cached_by_source_total"):
                by_host = sum(cluster.metric(host, name, role=r, source="host") for r in ("prefill", "decode"))
                self.assertEqual(by_host, sum(cluster.metric(host, "pdserve_kv_offload_loaded_tokens_total", role=r)
                                              for r in ("prefill", "decode")), name)
                self.assertGreater(by_host, 0, name)
                self.assertGreater(sum(cluster.metric(host, name, role=r, source="device") for r in ("prefill", "decode")),
                                   0, name)
            self.assertGreater(sum(cluster.metric(host, "pdserve_kv_offload_loaded_tokens_total", role=r)
                                   for r in ("prefill", "decode")), 0)
            self.assertEqual(tier_total(host, "pdserve_kv_offload_corrupt_blocks_total", "host"), 0)
        finally:
            self.assertEqual(host.stop(), 0)

    def test_bad_host_tier_flags_are_refused_by_name(self):
        for args, what in ((["--kv-offload-host-gib", "-1"], "--kv-offload-host-gib: must be >= 0"),
                           (["--kv-offload-host-gib", "nan"], "--kv-offload-host-gib"),
                           (["--kv-offload-host-gib", "1e30"], "at most 1048576"),
                           (["--kv-offload-disk", os.path.join(WORKDIR, "big"), "--kv-offload-disk-gib", "1e30"],
                            "at most 1048576"),
                           (["--kv-tier-load", "sometimes"], "--kv-tier-load: 'sometimes' is not auto, always or faster")):
            self.assert_serve_refuses(args, what)

    def test_an_unusable_directory_is_refused_by_name(self):
        blocker = os.path.join(WORKDIR, "a_file")
        with open(blocker, "w") as f:
            f.write("x")
        for args, what in ((["--kv-offload-disk", os.path.join(blocker, "tier")], "--kv-offload-disk: cannot make"),
                           (["--kv-offload-disk", blocker], "is not a directory"),
                           (["--kv-offload-disk", os.path.join(WORKDIR, "t2"), "--kv-offload-disk-gib", "0"],
                            "--kv-offload-disk-gib")):
            self.assert_serve_refuses(args, what)


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
