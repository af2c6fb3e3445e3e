"""KV cache events in vLLM's format end to end: decode workers publishing on ZeroMQ, read by an
independent consumer written here from vLLM's schema (vllm/distributed/kv_events.py: msgpack
batches [ts, [events]], tagged array-like events; three-frame messages [topic, 8-byte big-endian
sequence, payload]; a ROUTER replay socket) with Debian's python3-zmq and python3-msgpack. The
consumer rebuilds each worker's cached block set through evictions, a late join (replay) and a
worker restart, and it must equal the set the worker itself reports (WatchLoad's snapshot).

Run: /usr/bin/python3 tests/e2e/test_kv_events.py --pdserve build/pdserve
"""

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import msgpack
import xxhash
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb  # noqa: E402

PDSERVE = None
WORKDIR = None
MODEL = None
BLOCK = 4
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MASK64 = (1 << 64) - 1


def block_hash(parent, tokens):
    """pdserve's block hash recomputed from the tokens (scheme xxh3-128-chained-v1: XXH3-128 over
    the parent's 16 bytes, low half first, little-endian, then the tokens as int32 LE)."""
    data = (parent & MASK64).to_bytes(8, "little") + (parent >> 64).to_bytes(8, "little")
    data += b"".join(t.to_bytes(4, "little", signed=True) for t in tokens)
    return xxhash.xxh3_128_intdigest(data)


class Consumer:
    """What a KV-aware router does with a worker's stream: the set of cached block hashes. It
    also recomputes each stored block's hash from the tokens the event carries and checks the
    published one is its low 64 bits (as a consumer keying blocks by its own hash would)."""

    def __init__(self, endpoint, replay_endpoint, topic=b""):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        # A DEALER with REQ's envelope (an empty delimiter frame): a replay is many messages
        # for one request, which a REQ socket would drop after the first.
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.blocks = set()
        self.tiers = {}  # A KV cache tier's medium ("DISK", "STORE") -> its blocks.
        self.tier_removed = 0
        self.full = {}  # Published hash -> the whole 128-bit hash this consumer computed.
        self.last_seq = -1
        self.stored = self.removed = self.cleared = self.replayed = self.received = 0
        self.topic = topic

    def close(self):
        self.ctx.destroy(linger=0)

    def apply(self, payload, block_size):
        ts, events = msgpack.unpackb(payload)[:2]
        assert isinstance(ts, float) and ts > 1e9, ts
        for e in events:
            kind = e[0]
            if kind == "AllBlocksCleared":
                self.blocks.clear()
                self.tiers.clear()
                self.cleared += 1
            elif kind == "BlockStored" and e[6] != "CPU":
                # A KV cache tier's: its own set. Its parent may be in no set (evicted, or a block
                # the tier held before the worker started, announced without parent or tokens).
                hashes, parent, tokens, size, lora_id, medium = e[1:7]
                assert medium in ("DISK", "STORE") and (size, lora_id) == (block_size, None), e
                assert len(tokens) in (0, len(hashes) * size), e
                for i, h in enumerate(hashes):
                    if tokens and parent is not None and parent in self.full:
                        whole = block_hash(self.full[parent] if i == 0 else self.full[hashes[i - 1]],
                                           tokens[i * size:(i + 1) * size])
                        assert whole & MASK64 == h, (h, e)
                        self.full[h] = whole
                self.tiers.setdefault(medium, set()).update(hashes)
            elif kind == "BlockRemoved" and e[2] != "CPU":
                hashes, medium = e[1:3]
                for h in hashes:
                    assert h in self.tiers.get(medium, ()), (h, medium)  # Only what was stored goes.
                    self.tiers[medium].discard(h)
                self.tier_removed += len(hashes)
            elif kind == "BlockStored":
                hashes, parent, tokens, size, lora_id, medium = e[1:7]
                assert (size, lora_id, medium) == (block_size, None, "CPU"), e
                assert len(tokens) == len(hashes) * size, e
                # A stored block's parent is cached already (its sequence holds it).
                assert parent is None or parent in self.blocks, (parent, e)
                whole = 0 if parent is None else self.full[parent]
                for i, h in enumerate(hashes):
                    whole = block_hash(whole, tokens[i * size:(i + 1) * size])
                    assert whole & MASK64 == h, (h, e)
                    self.full[h] = whole
                self.blocks.update(hashes)
                self.stored += len(hashes)
            elif kind == "BlockRemoved":
                hashes, medium = e[1:3]
                assert medium == "CPU"
                for h in hashes:
                    assert h in self.blocks, h  # Only what was stored is evicted.
                    self.blocks.discard(h)
                self.removed += len(hashes)
            else:
                raise AssertionError(f"unknown event {kind!r}")

    def request_replay(self, start, block_size, until=None):
        """Applies the kept batches from `start` (up to `until`, exclusive, if given)."""
        self.replay.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            if not self.replay.poll(5000):
                raise AssertionError("no replay answer")
            delimiter, seq_bytes, payload = self.replay.recv_multipart()
            assert delimiter == b""
            if seq_bytes == END_SEQ:
                assert payload == b""
                return
            seq = int.from_bytes(seq_bytes, "big")
            if seq > self.last_seq and (until is None or seq < until):
                self.apply(payload, block_size)
                self.last_seq = seq
                self.replayed += 1

    def drain(self, block_size, quiet=0.5):
        """Reads until the stream has been quiet for `quiet` seconds."""
        while self.sub.poll(int(quiet * 1000)):
            topic, seq_bytes, payload = self.sub.recv_multipart()
            assert topic == self.topic
            self.received += 1
            seq = int.from_bytes(seq_bytes, "big")
            if seq <= self.last_seq:
                # The sequence started again: the worker restarted. Its batches from 0 on say
                # what it holds now (the first one clears).
                self.blocks.clear()
                self.last_seq = -1
            if seq > self.last_seq + 1:
                self.request_replay(self.last_seq + 1, block_size, until=seq)
            assert seq == self.last_seq + 1, (seq, self.last_seq)
            self.apply(payload, block_size)
            self.last_seq = seq


def worker_blocks(address):
    """The worker's own report: WatchLoad's first message is a snapshot of its cached hashes."""
    stub = worker_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(address))
    call = stub.WatchLoad(worker_pb2.WatchLoadRequest(after_seq=0), timeout=10)
    report = next(call)
    call.cancel()
    assert report.snapshot
    return {int.from_bytes(h[:8], "little") for h in report.stored}


def start_decode(pub_port, replay_port, extra=()):
    return cluster.Process(PDSERVE, ["decode", "--model", MODEL, "--listen", "127.0.0.1:0",
                                     "--threads", "1", "--block-size", str(BLOCK), "--kv-blocks", "40",
                                     "--local-prefill-tokens", "100000",
                                     "--kv-events-publisher", "zmq",
                                     "--kv-events-endpoint", f"tcp://*:{pub_port}",
                                     "--kv-events-replay-endpoint", f"tcp://*:{replay_port}",
                                     "--kv-events-topic", "kv@test", *extra])


def workload(address, seed, n=24):
    """Multi-turn-like prompts over a few shared prefixes: reuse, and more blocks than the pool
    holds (evictions)."""
    rng = random.Random(seed)
    bases = [[rng.randrange(3, 500) for _ in range(rng.randrange(8, 20))] for _ in range(4)]
    stub = worker_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(address))
    for i in range(n):
        ids = rng.choice(bases) + [rng.randrange(3, 500) for _ in range(rng.randrange(4, 24))]
        req = worker_pb2.DecodeRequest(request_id=f"r{seed}-{i}", prompt_ids=ids, seed=i,
                                       sampling=pb.SamplingParams(max_tokens=6, temperature=0,
                                                                  ignore_eos=True))
        got = [t for r in stub.Generate(req, timeout=60) for t in r.token_ids]
        assert len(got) == 6, got


def drain_heard(consumer, address, seed):
    """Drains `consumer` after a workload, making sure it heard the worker. ZeroMQ's slow joiner:
    a SUB that has just (re)connected misses what was published before its subscription reached
    the publisher. What it misses before a message it hears, it replays; but if the workload ended
    before the subscription arrived it heard nothing and cannot know. Then single requests (their
    blocks are new) go on until it hears one, as a router's next request would."""
    before = consumer.received
    consumer.drain(BLOCK)
    for i in range(40):
        if consumer.received > before:
            return
        workload(address, seed=1000 * seed + i, n=1)
        consumer.drain(BLOCK)
    raise AssertionError("the consumer heard nothing from the worker")


# vLLM's documented event schema (vllm/distributed/kv_events.py, array-like msgspec structs
# tagged by class name), written here from its documentation, not from pdserve's encoder:
# field names in order, each with the Python types msgpack may decode it to.
UINT64 = "uint64"
VLLM_EVENTS = {
    "BlockStored": [("block_hashes", [UINT64]), ("parent_block_hash", (UINT64, None)), ("token_ids", [int]),
                    ("block_size", int), ("lora_id", (int, None)), ("medium", (str, None)),
                    ("lora_name", (str, None))],
    "BlockRemoved": [("block_hashes", [UINT64]), ("medium", (str, None))],
    "AllBlocksCleared": [],
}


def conforms(value, kind):
    if kind is None:
        return value is None
    if kind == UINT64:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 64
    if isinstance(kind, tuple):
        return any(conforms(value, k) for k in kind)
    if isinstance(kind, list):
        return isinstance(value, list) and all(conforms(v, kind[0]) for v in value)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def check_vllm_batch(test, payload, medium="CPU", tiers=()):
    """One batch's raw msgpack against VLLM_EVENTS: [ts, events(, data_parallel_rank)]; every event
    an array [tag, field...] with every documented field, each of its type. Returns the events."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    test.assertIsInstance(batch, list)
    test.assertIn(len(batch), (2, 3))
    test.assertIsInstance(batch[0], float)
    if len(batch) == 3:
        test.assertTrue(conforms(batch[2], (int, None)))
    for e in batch[1]:
        test.assertIsInstance(e, list)
        fields = VLLM_EVENTS[e[0]]
        test.assertEqual(len(e), 1 + len(fields), f"{e[0]} carries {len(e) - 1} fields, vLLM's has {len(fields)}")
        for (name, kind), value in zip(fields, e[1:]):
            test.assertTrue(conforms(value, kind), f"{e[0]}.{name} = {value!r}")
        named = dict(zip([n for n, _ in fields], e[1:]))
        if "medium" in named:
            test.assertIn(named["medium"], (medium, *tiers))
        if e[0] == "BlockStored":
            test.assertIsNone(named["lora_id"])
            test.assertIsNone(named["lora_name"])
            test.assertIn(len(named["token_ids"]), (0, len(named["block_hashes"]) * named["block_size"])
                          if named["medium"] in tiers else (len(named["block_hashes"]) * named["block_size"],))
    return batch[1]


def replay_all(test, replay_port):
    """Every kept batch's payload, from sequence 0, through a DEALER."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    payloads = []
    try:
        while True:
            test.assertTrue(dealer.poll(5000), "no replay answer")
            _, seq, payload = dealer.recv_multipart()
            if seq == END_SEQ:
                return payloads
            test.assertEqual(int.from_bytes(seq, "big"), len(payloads))
            payloads.append(payload)
    finally:
        ctx.destroy(linger=0)


class KvEventsTest(unittest.TestCase):
    def test_serve_and_prefill_workers_publish_vllms_fields(self):
        """serve (its decode worker's cache) and a separate prefill worker publish batches whose every
        event has vLLM's fields in vLLM's order and types; a subscriber connected before the worker
        started misses sequence 0 on the PUB socket (ZeroMQ's late joiner) and recovers it by replay."""
        pub_port, replay_port = free_port(), free_port()
        early_ctx = zmq.Context()
        early = early_ctx.socket(zmq.SUB)
        early.setsockopt(zmq.SUBSCRIBE, b"")
        early.connect(f"tcp://127.0.0.1:{pub_port}")  # Before anything listens there.
        s = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                      "--block-size", str(BLOCK), "--kv-blocks", "40",
                                      "--kv-events-publisher", "zmq",
                                      "--kv-events-endpoint", f"tcp://*:{pub_port}",
                                      "--kv-events-replay-endpoint", f"tcp://*:{replay_port}"])
        try:
            from pdserve.v1 import generation_pb2_grpc as pbg
            stub = pbg.GenerationStub(grpc.insecure_channel(s.grpc))
            heard = []
            for i in range(60):  # Until the early subscriber hears a batch (it reconnects on its own).
                req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5 + i] * 13),
                                         sampling=pb.SamplingParams(max_tokens=6, temperature=0))
                list(stub.Generate(req, timeout=60))
                while early.poll(200):
                    heard.append(early.recv_multipart())
                if heard:
                    break
            self.assertGreater(len(heard), 0, "the early subscriber heard nothing")
            # What it heard first is (almost always) past sequence 0: the AllBlocksCleared went out
            # before its connection was up. Replay from 0 gives it (the late-joiner rule of docs/guide/monitoring.md).
            payloads = replay_all(self, replay_port)
            kinds = [e[0] for p in payloads for e in check_vllm_batch(self, p)]
            self.assertEqual(kinds[0], "AllBlocksCleared")  # Sequence 0, recovered by replay.
            self.assertIn("BlockStored", kinds)
        finally:
            early_ctx.destroy(linger=0)
            self.assertEqual(s.stop(), 0)
        # A prefill worker publishes its own cache, in the same form.
        pub_port, replay_port = free_port(), free_port()
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1,
                            prefill_args=["--block-size", str(BLOCK), "--kv-events-publisher", "zmq",
                                          "--kv-events-endpoint", f"tcp://*:{pub_port}",
                                          "--kv-events-replay-endpoint", f"tcp://*:{replay_port}"],
                            decode_args=["--block-size", str(BLOCK)], router_args=["--block-size", str(BLOCK)])
        try:
            from pdserve.v1 import generation_pb2_grpc as pbg
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            for i in range(4):
                req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[40 + i] * 30),
                                         sampling=pb.SamplingParams(max_tokens=4, temperature=0))
                list(stub.Generate(req, timeout=60))
            payloads = replay_all(self, replay_port)
            kinds = [e[0] for p in payloads for e in check_vllm_batch(self, p)]
            self.assertEqual(kinds[0], "AllBlocksCleared")
            self.assertIn("BlockStored", kinds)
        finally:
            self.assertEqual(c.stop(), [0, 0, 0])


    def test_consumers_rebuild_the_workers_cache_through_evictions_late_joins_and_a_restart(self):
        pub_port, replay_port = free_port(), free_port()
        worker = start_decode(pub_port, replay_port)
        self.assertEqual(worker.addresses["kv_events"], f"tcp://0.0.0.0:{pub_port}")
        self.assertEqual(worker.addresses["kv_events_replay"], f"tcp://0.0.0.0:{replay_port}")
        early = Consumer(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", b"kv@test")
        try:
            time.sleep(0.3)  # Let the subscription reach the publisher (ZeroMQ's slow joiner).
            workload(worker.grpc, seed=1)
            drain_heard(early, worker.grpc, seed=1)
            own = worker_blocks(worker.grpc)
            self.assertGreater(len(own), 0)
            self.assertEqual(early.blocks, own)
            self.assertGreater(early.removed, 0, "the workload was to evict")
            self.assertEqual(early.stored - early.removed, len(own))

            # A consumer that joins now asks for everything from sequence 0 and catches up.
            late = Consumer(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", b"kv@test")
            try:
                late.request_replay(0, BLOCK)
                self.assertEqual(late.cleared, 1)  # Batch 0 is the worker's empty start.
                self.assertEqual(late.blocks, own)
                self.assertEqual(late.last_seq, early.last_seq)
                # A malformed replay request (here: a 3-byte sequence) is ignored, the socket
                # still answers the next one.
                dealer = late.ctx.socket(zmq.DEALER)
                dealer.connect(f"tcp://127.0.0.1:{replay_port}")
                dealer.send_multipart([b"", b"abc"])
                dealer.send_multipart([b"", (early.last_seq).to_bytes(8, "big")])
                self.assertTrue(dealer.poll(5000))
                self.assertEqual(dealer.recv_multipart()[1], early.last_seq.to_bytes(8, "big"))
                self.assertTrue(dealer.poll(5000))
                self.assertEqual(dealer.recv_multipart()[1], END_SEQ)
                dealer.close(linger=0)
                time.sleep(0.3)
                workload(worker.grpc, seed=2, n=8)
                drain_heard(late, worker.grpc, seed=2)
                drain_heard(early, worker.grpc, seed=2)
                own = worker_blocks(worker.grpc)
                self.assertEqual(late.blocks, own)
                self.assertEqual(early.blocks, own)
            finally:
                late.close()

            # The worker restarts on the same ports with an empty cache: the early consumer sees
            # the sequence start again, replays the new run from 0 and follows it.
            self.assertEqual(worker.stop(), 0)
            worker = start_decode(pub_port, replay_port)
            time.sleep(0.5)
            workload(worker.grpc, seed=3, n=6)
            drain_heard(early, worker.grpc, seed=3)
            own = worker_blocks(worker.grpc)
            self.assertEqual(early.blocks, own)
            self.assertGreaterEqual(early.cleared, 2)
        finally:
            early.close()
            self.assertEqual(worker.stop(), 0)

    def test_a_disk_tiers_blocks_are_published_with_their_medium(self):
        """A decode worker with a disk tier publishes the blocks it writes there and those its budget
        evicts as BlockStored / BlockRemoved with medium "DISK" (vLLM's fields): a consumer's DISK
        set equals the blocks in the directory (the hashes its file names carry), and after a
        restart on the same directory (AllBlocksCleared, then what the directory holds) too."""
        tier = os.path.join(WORKDIR, "events_disk_tier")
        shutil.rmtree(tier, ignore_errors=True)

        def on_disk():
            return {int(n[48:64], 16) for n in os.listdir(tier) if n.endswith(".kvb")}

        def settled(consumer, worker, seed):
            deadline = time.time() + 30
            while consumer.tiers.get("DISK", set()) != on_disk() and time.time() < deadline:
                drain_heard(consumer, worker.grpc, seed)
            self.assertEqual(consumer.tiers.get("DISK", set()), on_disk())

        pub_port, replay_port = free_port(), free_port()
        disk = ("--kv-offload-disk", tier, "--kv-offload-disk-gib", "0.00005")  # 25 blocks of 2,112 bytes
        worker = start_decode(pub_port, replay_port, disk)
        consumer = Consumer(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", b"kv@test")
        try:
            time.sleep(0.3)
            workload(worker.grpc, seed=11, n=40)
            settled(consumer, worker, 11)
            self.assertGreater(len(on_disk()), 0)
            self.assertGreater(consumer.tier_removed, 0, "the workload was to fill the disk budget")
            self.assertEqual(consumer.blocks, worker_blocks(worker.grpc))
            payloads = replay_all(self, replay_port)
            media = {e[6 if e[0] == "BlockStored" else 2] for p in payloads
                     for e in check_vllm_batch(self, p, tiers=("DISK",)) if e[0] != "AllBlocksCleared"}
            self.assertEqual(media, {"CPU", "DISK"})
            # Restarted on the same directory: the consumer sees the sequence start again, and the
            # new run announces what the directory holds.
            self.assertEqual(worker.stop(), 0)
            held = on_disk()
            # A larger budget now, so that nothing the directory held is evicted by the requests
            # that follow: every one of its blocks must be announced.
            worker = start_decode(pub_port, replay_port, ("--kv-offload-disk", tier, "--kv-offload-disk-gib", "0.001"))
            time.sleep(0.5)
            workload(worker.grpc, seed=12, n=2)
            settled(consumer, worker, 12)
            self.assertLessEqual(held, consumer.tiers["DISK"], "the blocks kept across the restart were not announced")
        finally:
            consumer.close()
            self.assertEqual(worker.stop(), 0)

    def test_bad_flags_are_refused_naming_them(self):
        for args, flag in ((["--kv-events-publisher", "nats"], "--kv-events-publisher"),
                           (["--kv-events-publisher", "zmq", "--kv-events-buffer-steps", "0"],
                            "--kv-events-buffer-steps"),
                           (["--kv-events-publisher", "zmq", "--kv-events-endpoint", "bogus://x"],
                            "--kv-events-endpoint")):
            r = subprocess.run([PDSERVE, "decode", "--model", MODEL, "--listen", "127.0.0.1:0", *args],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(flag, r.stderr)
        # Taken: a second worker on the same PUB port.
        port = free_port()
        first = start_decode(port, free_port())
        try:
            r = subprocess.run([PDSERVE, "decode", "--model", MODEL, "--listen", "127.0.0.1:0",
                                "--kv-events-publisher", "zmq", "--kv-events-endpoint", f"tcp://*:{port}"],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(f"--kv-events-endpoint: cannot bind tcp://*:{port}", r.stderr)
        finally:
            self.assertEqual(first.stop(), 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_kv_events_")
    MODEL = os.path.join(WORKDIR, "model")
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "llama", "--layers", "2", "--hidden", "64",
                    "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--seed", "3"],
                   check=True, capture_output=True)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
