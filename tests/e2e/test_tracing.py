"""Distributed tracing end to end: a router, a prefill worker and decode workers in separate
processes export OTLP/HTTP protobuf to a collector run by this test, which decodes it with
OpenTelemetry's own protos (opentelemetry-proto from npm, scripts/otlp_protos_setup.sh, compiled
here by protoc): an independent decoder. Checked: one trace per request under the client's
traceparent, the parent/child structure across the three processes, timings that nest, the
GenAI attributes; a resumed request's two decode attempts; a malformed traceparent starts a new
trace; a collector that is gone costs the requests nothing and the drops are counted.

Run: /usr/bin/python3 tests/e2e/test_tracing.py --pdserve build/pdserve
"""

import argparse
import concurrent.futures
import http.server
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402
from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402

PDSERVE = None
WORKDIR = None
MODEL = None
OTLP = None  # The compiled trace_service_pb2 module.
ENGINE = ("--threads", "1", "--kv-memory-gib", "0.05")


def load_otlp():
    protos = subprocess.run([os.path.join(cluster.ROOT, "scripts", "otlp_protos_setup.sh")],
                            check=True, capture_output=True, text=True).stdout.strip()
    out = tempfile.mkdtemp(prefix="otlp_py_", dir=WORKDIR)
    files = [os.path.relpath(os.path.join(d, f), protos) for d, _, fs in os.walk(protos)
             for f in fs if f.endswith(".proto")]
    subprocess.run(["protoc", f"-I{protos}", f"--python_out={out}", *files], check=True, cwd=protos)
    sys.path.insert(0, out)
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    return trace_service_pb2


class Collector:
    """An OTLP/HTTP receiver: every span it was sent, with its resource's attributes."""

    def __init__(self):
        self.spans = []
        self.lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.path == "/v1/traces", self.path
                assert self.headers["Content-Type"] == "application/x-protobuf"
                req = OTLP.ExportTraceServiceRequest()
                req.ParseFromString(body)
                with collector.lock:
                    for rs in req.resource_spans:
                        resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            assert ss.scope.name == "pdserve"
                            for s in ss.spans:
                                collector.spans.append((resource, s))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def close(self):
        self.server.shutdown()

    def trace(self, trace_id):
        with self.lock:
            return [(r, s) for r, s in self.spans if s.trace_id == trace_id]

    def wait(self, trace_id, names, timeout=20):
        """The trace's spans once it holds every name in `names`."""
        return self.wait_for(trace_id, lambda spans: set(names) <= {s.name for _, s in spans},
                             f"the spans {sorted(names)}", timeout)

    def wait_for(self, trace_id, ready, what, timeout=20):
        """The trace's spans once ready(spans) holds (each process exports its own spans, in its
        own time: one process's span that ends later may still arrive first)."""
        deadline = time.time() + timeout
        while True:
            spans = self.trace(trace_id)
            if ready(spans):
                return spans
            if time.time() > deadline:
                raise AssertionError(f"trace {trace_id.hex()} lacks {what}; has {sorted(s.name for _, s in spans)}")
            time.sleep(0.05)


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind)


def attrs(span):
    return {kv.key: value(kv.value) for kv in span.attributes}


def traceparent(trace_id, span_id):
    return f"00-{trace_id.hex()}-{span_id.hex()}-01"


def generate(stub, ids, max_tokens, metadata=()):
    sp = pb.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sp)
    return [t for r in stub.Generate(req, metadata=metadata, timeout=120) for t in r.token_ids]


KIND_SERVER, KIND_CLIENT = 2, 3


class TracingTest(unittest.TestCase):
    def setUp(self):
        self.collector = Collector()
        self.tracing = ("--otlp-traces-endpoint", self.collector.url)

    def tearDown(self):
        self.collector.close()

    def check_nested(self, spans):
        by_id = {s.span_id: s for _, s in spans}
        for _, s in spans:
            if s.parent_span_id in by_id:
                p = by_id[s.parent_span_id]
                self.assertLessEqual(p.start_time_unix_nano, s.start_time_unix_nano, (p.name, s.name))
                self.assertLessEqual(s.end_time_unix_nano, p.end_time_unix_nano, (p.name, s.name))
            self.assertLessEqual(s.start_time_unix_nano, s.end_time_unix_nano, s.name)

    def test_one_trace_per_request_across_the_three_processes(self):
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, engine_args=ENGINE,
                            router_args=self.tracing, decode_args=self.tracing, prefill_args=self.tracing)
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            rng = random.Random(5)
            for i in range(3):
                trace_id, client_span = rng.randbytes(16), rng.randbytes(8)
                ids = [rng.randrange(3, 500) for _ in range(40)]  # Past --local-prefill-tokens 4.
                out = generate(stub, ids, 20, (("traceparent", traceparent(trace_id, client_span)),
                                                ("tracestate", "vendor=x")))
                self.assertEqual(len(out), 20)
                spans = self.collector.wait(trace_id, [
                    "pdserve.generate", "pdserve.router.prepare", "pdserve.router.admit",
                    "pdserve.router.route", "pdserve.router.decode_attempt", "pdserve.decode",
                    "pdserve.decode.reserve", "pdserve.decode.remote_prefill", "pdserve.prefill",
                    "pdserve.prefill.queue", "pdserve.prefill.compute", "pdserve.prefill.chunk",
                    "pdserve.prefill.transfer", "pdserve.decode.verify", "pdserve.decode.generate"])
                one = {}
                for resource, s in spans:
                    self.assertNotIn(s.name, one, f"{s.name} twice")  # One chunk: 40 tokens.
                    one[s.name] = (resource, s)

                def parent(name):
                    return one[name][1].parent_span_id

                def span_id(name):
                    return one[name][1].span_id

                # Under the client's span; the tree across the three processes.
                self.assertEqual(parent("pdserve.generate"), client_span)
                for name in ("pdserve.router.prepare", "pdserve.router.admit", "pdserve.router.route",
                             "pdserve.router.decode_attempt"):
                    self.assertEqual(parent(name), span_id("pdserve.generate"), name)
                self.assertEqual(parent("pdserve.decode"), span_id("pdserve.router.decode_attempt"))
                for name in ("pdserve.decode.reserve", "pdserve.decode.remote_prefill",
                             "pdserve.decode.verify", "pdserve.decode.generate"):
                    self.assertEqual(parent(name), span_id("pdserve.decode"), name)
                self.assertEqual(parent("pdserve.prefill"), span_id("pdserve.decode.remote_prefill"))
                for name in ("pdserve.prefill.queue", "pdserve.prefill.compute", "pdserve.prefill.transfer"):
                    self.assertEqual(parent(name), span_id("pdserve.prefill"), name)
                self.assertEqual(parent("pdserve.prefill.chunk"), span_id("pdserve.prefill.compute"))
                # Which process said what.
                roles = {name: one[name][0]["pdserve.role"] for name in one}
                self.assertEqual({roles["pdserve.generate"], roles["pdserve.router.decode_attempt"]}, {"router"})
                self.assertEqual({roles[n] for n in one if n.startswith("pdserve.decode")}, {"decode"})
                self.assertEqual({roles[n] for n in one if n.startswith("pdserve.prefill")}, {"prefill"})
                self.assertEqual({one[n][0]["service.name"] for n in one}, {"pdserve"})
                kinds = {n: one[n][1].kind for n in one}
                self.assertEqual((kinds["pdserve.generate"], kinds["pdserve.decode"], kinds["pdserve.prefill"]),
                                 (KIND_SERVER, KIND_SERVER, KIND_SERVER))
                self.assertEqual((kinds["pdserve.router.decode_attempt"], kinds["pdserve.decode.remote_prefill"]),
                                 (KIND_CLIENT, KIND_CLIENT))
                self.assertEqual({s.trace_state for _, s in spans}, {"vendor=x"})
                self.check_nested(spans)
                # OpenTelemetry's GenAI attributes, and ours.
                root = attrs(one["pdserve.generate"][1])
                self.assertEqual(root["gen_ai.operation.name"], "text_completion")
                self.assertEqual(root["gen_ai.request.model"], "model")
                self.assertEqual((root["gen_ai.usage.input_tokens"], root["gen_ai.usage.output_tokens"]), (40, 20))
                self.assertEqual(root["gen_ai.response.finish_reasons"], ["length"])
                self.assertEqual(root["gen_ai.request.max_tokens"], 20)
                self.assertEqual(root["pdserve.attempts"], 1)
                self.assertIn("first_token", [e.name for e in one["pdserve.generate"][1].events])
                self.assertEqual(attrs(one["pdserve.router.decode_attempt"][1])["pdserve.prefill_worker"],
                                 c.prefill[0].grpc)
                remote = attrs(one["pdserve.decode.remote_prefill"][1])
                self.assertEqual(remote["pdserve.transfer_pages"], 3 * 2)  # ceil(40/16) blocks x 2 layers.
                self.assertGreater(remote["pdserve.transfer_bytes"], 0)
                self.assertEqual(attrs(one["pdserve.prefill.transfer"][1])["pdserve.transfer_pages"], 6)
                self.assertEqual(attrs(one["pdserve.prefill.chunk"][1])["pdserve.chunk_tokens"], 40)
                self.assertEqual(attrs(one["pdserve.decode"][1])["gen_ai.usage.output_tokens"], 20)
                gen = one["pdserve.decode.generate"][1]
                self.assertEqual([e.name for e in gen.events], ["tokens"])  # At 16 of 20 tokens.
                for _, s in spans:
                    self.assertEqual(s.status.code, 0, (s.name, s.status.message))

            # A malformed traceparent: a new trace, a root span.
            before = {s.trace_id for _, s in self.collector.spans}
            self.assertEqual(len(generate(stub, [7] * 8, 3, (("traceparent", "00-zz-bad-01"),))), 3)
            deadline = time.time() + 20
            while True:
                roots = [s for _, s in self.collector.spans
                         if s.name == "pdserve.generate" and s.trace_id not in before]
                if roots or time.time() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(len(roots), 1)
            self.assertEqual(roots[0].parent_span_id, b"")
        finally:
            self.assertEqual(c.stop(), [0, 0, 0])

    def test_sampling_decisions_hold_on_every_tier(self):
        """A client's traceparent with flags 00 (not sampled) gives no span on any tier; with
        --trace-sample-ratio 0.5 each new trace has all of its spans on all three tiers or none
        (the router decides, the workers follow the propagated flag, never a coin of their own)."""
        sampling = (*self.tracing, "--trace-sample-ratio", "0.5")
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, engine_args=ENGINE,
                            router_args=sampling, decode_args=sampling, prefill_args=sampling)
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            rng = random.Random(21)
            unsampled = [rng.randbytes(16) for _ in range(8)]
            for t in unsampled:
                out = generate(stub, [rng.randrange(3, 500) for _ in range(40)], 4,
                               (("traceparent", f"00-{t.hex()}-{rng.randbytes(8).hex()}-00"),))
                self.assertEqual(len(out), 4)
            for i in range(40):
                self.assertEqual(len(generate(stub, [rng.randrange(3, 500) for _ in range(40)], 4)), 4)
            # A sampled request last: once its spans are in from all three processes, so is
            # everything each of them queued before it.
            last = rng.randbytes(16)
            generate(stub, [9] * 40, 4, (("traceparent", traceparent(last, b"\2" * 8)),))
            self.collector.wait(last, ["pdserve.generate", "pdserve.decode", "pdserve.prefill"])
            with self.collector.lock:
                spans = list(self.collector.spans)
            seen = {s.trace_id for _, s in spans}
            self.assertEqual(seen & set(unsampled), set(), "a trace its client did not sample has spans")
            by_trace = {}
            for resource, s in spans:
                if s.trace_id != last:
                    by_trace.setdefault(s.trace_id, set()).add((resource["pdserve.role"], s.name))
            roles = {t: {r for r, _ in names} for t, names in by_trace.items()}
            self.assertGreater(len(by_trace), 0)
            self.assertLess(len(by_trace), 40, "every new trace was sampled at ratio 0.5")
            for t, names in by_trace.items():
                self.assertEqual(roles[t], {"router", "decode", "prefill"}, t.hex())
                for name in ("pdserve.generate", "pdserve.decode", "pdserve.prefill"):
                    self.assertIn(name, {n for _, n in names}, t.hex())
        finally:
            self.assertEqual(c.stop(), [0, 0, 0])

    def test_a_resumed_request_shows_both_decode_attempts(self):
        """The victim's streams are held open at their end (the fault holds each stream's final
        message until the kill): the test model writes 600 tokens in ~0.2 s, and a kill that raced
        it found the victim already done on a loaded CI machine (it ran nothing at the kill: CI
        failed on it). Held, whatever the machine's speed, the victim's streams break at the kill,
        mid-generation or after their last token but before their end."""
        c = cluster.Cluster(PDSERVE, MODEL, prefill=0, decode=2, engine_args=ENGINE,
                            router_args=self.tracing, decode_args=self.tracing,
                            decode_env=[{"PDSERVE_FAULT_GRPC_DELAY_FINAL_MESSAGE_MS": "600000"}])
        admin_channel = grpc.insecure_channel(c.router.grpc)  # Polled every 10 ms: one channel.
        admin = worker_pb2_grpc.RouterAdminStub(admin_channel)

        def on_victim():
            stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
            return sum(w.inflight for w in stats.decode if w.address == c.decode[0].grpc)
        stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
        rng = random.Random(9)
        traces = [rng.randbytes(16) for _ in range(12)]
        progress = [0] * len(traces)

        def run(i):
            sp = pb.SamplingParams(temperature=0, max_tokens=600, ignore_eos=True)
            req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[rng.randrange(3, 500) for _ in range(8)]),
                                     sampling=sp)
            n = 0
            for r in stub.Generate(req, metadata=(("traceparent", traceparent(traces[i], b"\1" * 8)),),
                                   timeout=120):
                n += len(r.token_ids)
                progress[i] = n
            return n

        try:
            with concurrent.futures.ThreadPoolExecutor(len(traces)) as pool:
                futures = [pool.submit(run, i) for i in range(len(traces))]
                victim = c.decode[0]
                deadline = time.time() + 60
                # Every stream has tokens, so those on the victim have streamed some before the
                # kill (a total over all streams could be the survivor's alone: it failed so
                # under a loaded ctest run).
                while (on_victim() == 0 or min(progress) == 0) and time.time() < deadline:
                    time.sleep(0.01)
                self.assertGreater(on_victim(), 0, "the router sent the victim nothing")
                victim.proc.kill()
                victim.proc.wait()
                self.assertEqual([f.result(timeout=120) for f in futures], [600] * len(traces))
            resumed, resumed_any = 0, False
            for t in traces:
                spans = self.collector.wait(t, ["pdserve.generate", "pdserve.decode"])
                root = [s for _, s in spans if s.name == "pdserve.generate"][0]
                # The root span ends when the request does (after every attempt's span).
                if attrs(root)["pdserve.attempts"] < 2:
                    continue
                resumed += 1
                attempts = sorted((s for _, s in spans if s.name == "pdserve.router.decode_attempt"),
                                  key=lambda s: attrs(s)["pdserve.attempt"])
                # The survivor exports its spans itself: the router's root may arrive before them
                # (and the victim's own decode span, when its engine had finished, is there already).
                second_id = attempts[-1].span_id

                def survivors(spans):
                    ids = {s.span_id for _, s in spans if s.name == "pdserve.decode" and s.parent_span_id == second_id}
                    return any(s.name == "pdserve.decode.generate" and s.parent_span_id in ids for _, s in spans)
                spans = self.collector.wait_for(t, survivors, "the survivor's decode and generate spans")
                self.assertEqual([attrs(a)["pdserve.attempt"] for a in attempts], [0, 1])
                self.assertEqual(attempts[0].status.code, 2)  # The broken stream: an error.
                self.assertEqual(attempts[1].status.code, 0)
                # What the first attempt had streamed, told by a count the router did not make:
                # the survivor generated the rest of the 600 tokens the client received.
                resumed_tokens = attrs(attempts[1])["pdserve.resumed_tokens"]
                self.assertEqual(attrs(attempts[1])["pdserve.decode_worker"], c.decode[1].grpc)
                # The survivor's span hangs under the second attempt and says what it resumed.
                second = [s for _, s in spans if s.name == "pdserve.decode"
                          and s.parent_span_id == attempts[1].span_id]
                self.assertEqual(len(second), 1)
                self.assertEqual(attrs(second[0])["pdserve.resumed_tokens"], resumed_tokens)
                generated = [s for _, s in spans if s.name == "pdserve.decode.generate"
                             and s.parent_span_id == second[0].span_id]
                self.assertEqual(len(generated), 1)
                self.assertEqual(resumed_tokens + attrs(generated[0])["gen_ai.usage.output_tokens"], 600)
                resumed_any = resumed_any or resumed_tokens > 0
                self.assertLessEqual(attempts[0].end_time_unix_nano, attempts[1].start_time_unix_nano)
            self.assertGreater(resumed, 0, "no request was on the killed worker: the test proved nothing")
            self.assertTrue(resumed_any, "every resumed request had streamed nothing before the kill")
        finally:
            admin_channel.close()
            c.router.stop()
            c.decode[1].stop()

    def test_the_http_api_passes_the_clients_trace_context_on(self):
        import json
        import urllib.request
        serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0",
                                          "--http-listen", "127.0.0.1:0", *ENGINE, *self.tracing])
        try:
            trace_id, client_span = bytes(range(1, 17)), bytes(range(1, 9))
            body = json.dumps({"model": "model", "prompt": [3, 4, 5, 6, 7, 8], "max_tokens": 5,
                               "temperature": 0, "ignore_eos": True}).encode()
            req = urllib.request.Request(f"http://{serve.addresses['http']}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json",
                                                  "traceparent": traceparent(trace_id, client_span)})
            with urllib.request.urlopen(req, timeout=60) as r:
                self.assertEqual(json.loads(r.read())["usage"]["completion_tokens"], 5)
            spans = self.collector.wait(trace_id, ["pdserve.generate", "pdserve.decode"])
            root = [s for _, s in spans if s.name == "pdserve.generate"][0]
            self.assertEqual(root.parent_span_id, client_span)
            self.assertEqual(attrs(root)["gen_ai.usage.output_tokens"], 5)
            # serve: one process, one resource.
            self.assertEqual({r["pdserve.role"] for r, _ in spans}, {"serve"})
        finally:
            self.assertEqual(serve.stop(), 0)

    def test_a_gone_collector_costs_requests_nothing_and_drops_are_counted(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            gone = f"http://127.0.0.1:{s.getsockname()[1]}/v1/traces"
        serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0",
                                          "--metrics-listen", "127.0.0.1:0", *ENGINE,
                                          "--otlp-traces-endpoint", gone])
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(serve.grpc))
            for i in range(5):
                self.assertEqual(len(generate(stub, [5 + i] * 12, 4)), 4)
            deadline = time.time() + 20
            while cluster.metric(serve, "pdserve_trace_spans_dropped_total") == 0 and time.time() < deadline:
                time.sleep(0.1)
            self.assertGreater(cluster.metric(serve, "pdserve_trace_spans_dropped_total"), 0)
            self.assertEqual(cluster.metric(serve, "pdserve_trace_spans_exported_total"), 0)
        finally:
            self.assertEqual(serve.stop(), 0)
        self.assertEqual(serve.stderr().count("did not take"), 1)  # Logged once, not per batch.

    def test_a_stalled_collector_delays_shutdown_by_one_timeout_at_most(self):
        """A collector that accepts connections and never answers: each export waits out its 2 s
        timeout, and the spans of a few hundred requests queue behind it. SIGTERM used to wait for
        every queued batch (2 s each); the final flush now has one deadline."""
        stalled = socket.socket()
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(256)  # Connections complete in the kernel; nothing is ever read.
        url = f"http://127.0.0.1:{stalled.getsockname()[1]}/v1/traces"
        args = ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", *ENGINE]
        # serve's own shutdown (its servers' long-lived load streams end at their deadline) as
        # the baseline, without tracing.
        def run(process):
            stub = pbg.GenerationStub(grpc.insecure_channel(process.grpc))
            for i in range(300):
                self.assertEqual(len(generate(stub, [5 + i % 50] * 8, 2)), 2)

        plain = cluster.Process(PDSERVE, args)
        run(plain)
        start = time.time()
        self.assertEqual(plain.stop(), 0)
        baseline = time.time() - start
        serve = cluster.Process(PDSERVE, args + ["--otlp-traces-endpoint", url])
        try:
            run(serve)
            start = time.time()
            self.assertEqual(serve.stop(), 0)
            # One 2 s export timeout for the final flush, not 2 s for each queued batch.
            self.assertLess(time.time() - start, baseline + 3.0, "shutdown waited for the stalled collector")
        finally:
            serve.stop()
            stalled.close()

    def test_bad_flags_are_refused_naming_them(self):
        for args, flag in ((["--otlp-traces-endpoint", "collector:4318"], "--otlp-traces-endpoint"),
                           (["--trace-sample-ratio", "2"], "--trace-sample-ratio")):
            for cmd in ("decode", "router"):
                extra = ["--decode", "127.0.0.1:1"] if cmd == "router" else []
                r = subprocess.run([PDSERVE, cmd, "--model", MODEL, "--listen", "127.0.0.1:0", *extra, *args],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 2, (cmd, r.stderr))
                self.assertIn(flag, r.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_tracing_")
    MODEL = os.path.join(WORKDIR, "model")
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "llama", "--layers", "2", "--hidden", "64",
                    "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--seed", "3"],
                   check=True, capture_output=True)
    OTLP = load_otlp()
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
