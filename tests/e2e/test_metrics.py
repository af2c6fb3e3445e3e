"""Prometheus metrics end to end: every tier's /metrics after real traffic, checked by promtool,
against what the client did and against the workers' own counters; a real Prometheus scraping
`pdserve serve`; the dashboard and alert rules refer only to exported names.

Run: /usr/bin/python3 tests/e2e/test_metrics.py --pdserve build/pdserve
"""

import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

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
HIDDEN, HEADS, KV_HEADS = 64, 4, 2
# One page = one block of one layer: K and V, f32, for every KV head (computed here from the
# model's shape, not read from pdserve).
PAGE_BYTES = 2 * KV_HEADS * BLOCK * (HIDDEN // HEADS) * 4
DEPLOY = os.path.join(cluster.ROOT, "deploy", "k8s")
DASHBOARD = os.path.join(DEPLOY, "grafana", "pdserve-dashboard.json")
ALERTS = os.path.join(DEPLOY, "prometheus", "pdserve-alerts.yaml")
ALERTS_TEST = os.path.join(DEPLOY, "prometheus", "pdserve-alerts_test.yaml")
METRICS = ("--metrics-listen", "127.0.0.1:0")


prompts, info = cluster.prompts, cluster.worker_info


def request(ids, max_tokens):
    sp = pb.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sp)


def generate(stub, ids, max_tokens):
    tokens = []
    for r in stub.Generate(request(ids, max_tokens), timeout=60):
        tokens += list(r.token_ids)
    return tokens


def transfer_bytes(ids):
    return math.ceil(len(ids) / BLOCK) * LAYERS * PAGE_BYTES


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers["Content-Type"]
        return r.read().decode()


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Exposition:
    """A parsed /metrics page: samples by (name, labels) and each family's type."""

    def __init__(self, text):
        self.text = text
        self.samples = {}
        self.types = {}
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                self.types[name] = kind
            elif line and not line.startswith("#"):
                m = _SAMPLE.match(line)
                assert m, f"unparsable sample line: {line!r}"
                labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
                self.samples[(m.group(1), labels)] = float(m.group(3))

    def value(self, name, **labels):
        """Sum over the series of `name` whose labels include `labels`."""
        want = set(labels.items())
        found = [v for (n, ls), v in self.samples.items() if n == name and want <= set(ls)]
        return sum(found) if found else None

    def monotonic_series(self):
        """Counters, and histograms' buckets, counts and sums (all only grow)."""
        out = {}
        for (name, labels), v in self.samples.items():
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            if self.types.get(name) == "counter" or self.types.get(base) == "histogram":
                out[(name, labels)] = v
        return out


def promtool_check(text):
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def check_histograms(test, page):
    """Buckets are cumulative, end in +Inf == _count, and span the quantity measured."""
    for family, kind in page.types.items():
        if kind != "histogram":
            continue
        series = {}
        for (name, labels), v in page.samples.items():
            if name == family + "_bucket":
                rest = tuple(l for l in labels if l[0] != "le")
                le = dict(labels)["le"]
                series.setdefault(rest, []).append((math.inf if le == "+Inf" else float(le), v))
        for rest, buckets in series.items():
            buckets.sort()
            counts = [v for _, v in buckets]
            test.assertEqual(counts, sorted(counts), f"{family}{rest} buckets not cumulative")
            test.assertEqual(buckets[-1][0], math.inf)
            test.assertEqual(buckets[-1][1], page.samples[(family + "_count", rest)])
            bounds = [b for b, _ in buckets[:-1]]
            if "inter_token" in family or "per_output_token" in family:
                test.assertLessEqual(bounds[0], 0.0001, family)  # Sub-millisecond decode steps.
                test.assertGreaterEqual(bounds[-1], 60, family)
            elif "first_token" in family:
                test.assertLessEqual(bounds[0], 0.001, family)
                test.assertGreaterEqual(bounds[-1], 600, family)
            elif "request" in family:
                test.assertLessEqual(bounds[0], 0.01, family)
                test.assertGreaterEqual(bounds[-1], 3600, family)  # Minutes of E2E fit, and more.
            elif "transfer" in family:
                test.assertLessEqual(bounds[0], 0.0001, family)
                test.assertGreaterEqual(bounds[-1], 30, family)


def used_metric_names():
    """Metric names the dashboard's and the alert rules' PromQL refer to."""
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("expr", "query", "definition") and isinstance(v, str):
                    exprs.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    with open(ALERTS) as f:
        exprs += [f.read()]
    names = set()
    for e in exprs:
        names |= set(re.findall(r"\b((?:pdserve|vllm)[_:][a-z0-9_]+)", e))
    return names


class MetricHelperTest(unittest.TestCase):
    """cluster.metric(), which the fault, client and OpenAI suites assert counters with: a name or
    label that is not there is an error, so a renamed metric cannot pass an "== 0" check."""
    TEXT = ("# HELP pdserve_request_success_total Finished requests.\n"
            "# TYPE pdserve_request_success_total counter\n"
            'pdserve_request_success_total{role="router",finished_reason="length"} 3\n'
            'pdserve_request_success_total{role="router",finished_reason="stop"} 2\n'
            'pdserve_request_success_total{role="decode",finished_reason="stop"} 2\n'
            "# HELP pdserve_router_resumes_total Resumptions.\n"
            "# TYPE pdserve_router_resumes_total counter\n"
            "pdserve_router_resumes_total 0\n"
            "# HELP pdserve_kv_transfer_failures_total Failed transfers.\n"
            "# TYPE pdserve_kv_transfer_failures_total counter\n"
            "# HELP pdserve_ttft_seconds TTFT.\n"
            "# TYPE pdserve_ttft_seconds histogram\n"
            'pdserve_ttft_seconds_bucket{role="router",le="+Inf"} 5\n'
            'pdserve_ttft_seconds_count{role="router"} 5\n')

    def test_sums_the_matching_series(self):
        self.assertEqual(cluster.parse_metric(self.TEXT, "pdserve_request_success_total"), 7)
        self.assertEqual(cluster.parse_metric(self.TEXT, "pdserve_request_success_total", role="router"), 5)
        self.assertEqual(cluster.parse_metric(self.TEXT, "pdserve_request_success_total", role="router",
                                              finished_reason="stop"), 2)
        self.assertEqual(cluster.parse_metric(self.TEXT, "pdserve_ttft_seconds_count"), 5)

    def test_declared_families_without_matching_series_are_zero(self):
        self.assertEqual(cluster.parse_metric(self.TEXT, "pdserve_request_success_total",
                                              finished_reason="abort"), 0)
        self.assertEqual(cluster.parse_metric(self.TEXT, "pdserve_kv_transfer_failures_total",
                                              reason="send_error"), 0)
        self.assertEqual(cluster.parse_metric(self.TEXT, "pdserve_router_resumes_total"), 0)

    def test_an_unknown_name_or_label_is_an_error(self):
        with self.assertRaisesRegex(AssertionError, "no metric family 'pdserve_router_resume_total'"):
            cluster.parse_metric(self.TEXT, "pdserve_router_resume_total")
        with self.assertRaisesRegex(AssertionError, r"has no label \['finish_reason'\]"):
            cluster.parse_metric(self.TEXT, "pdserve_request_success_total", finish_reason="stop")
        # A label value is matched whole, not as a substring of another label's.
        self.assertEqual(cluster.parse_metric(self.TEXT, "pdserve_request_success_total", role="route"), 0)


class MetricsTest(unittest.TestCase):
    def test_every_tier_exports_valid_metrics_that_match_the_traffic(self):
        # A corrupted page in the first transfer: one refused transfer, recomputed on decode.
        # The decode worker speculates (n-gram drafts): the same tokens, and vLLM's spec_decode
        # counters beside the rest.
        # Both workers keep a disk tier: its metrics (and the dashboard's panels of them) too.
        tiers = [("--kv-offload-disk", os.path.join(WORKDIR, f"tier_{r}"), "--kv-offload-disk-gib", "0.1")
                 for r in ("prefill", "decode")]
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1, prefill_args=(*METRICS, *tiers[0]),
                            decode_args=(*METRICS, *tiers[1], "--speculative", "ngram", "--num-speculative-tokens", "3",
                                         "--spec-ngram-min", "1", "--spec-step-budget=false"),
                            router_args=(*METRICS, "--http-listen", "127.0.0.1:0"),
                            prefill_env={"PDSERVE_FAULT_CORRUPT_KV_PAGE": "3"})
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            ps = prompts(6, 21, 40, 120)
            lengths = [3, 8, 1, 5, 2, 7]
            for p, n in zip(ps, lengths):
                self.assertEqual(len(generate(stub, p, n)), n)
            with self.assertRaises(grpc.RpcError) as bad:
                generate(stub, [1, 2, 100000], 4)
            self.assertEqual(bad.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            with urllib.request.urlopen(f"http://{c.router.addresses['http']}/v1/models", timeout=30) as models:
                self.assertEqual(models.status, 200)
            cluster.wait_idle(self, [(p, True) for p in c.prefill] + [(d, False) for d in c.decode])
            pages = {name: Exposition(scrape(p.addresses["metrics"]))
                     for name, p in (("router", c.router), ("prefill", c.prefill[0]), ("decode", c.decode[0]))}
            for name, page in pages.items():
                rc, out = promtool_check(page.text)
                self.assertEqual((rc, out), (0, ""), f"promtool check metrics on {name}")
                check_histograms(self, page)
            r, p, d = pages["router"], pages["prefill"], pages["decode"]
            n = len(ps)

            # The router counts what the client saw.
            self.assertEqual(r.value("pdserve_time_to_first_token_seconds_count", role="router"), n)
            self.assertEqual(r.value("pdserve_e2e_request_latency_seconds_count", role="router"), n)
            self.assertEqual(r.value("pdserve_inter_token_latency_seconds_count", role="router"),
                             sum(k - 1 for k in lengths))
            self.assertEqual(r.value("pdserve_request_time_per_output_token_seconds_count", role="router"),
                             sum(1 for k in lengths if k > 1))
            self.assertEqual(r.value("pdserve_request_success_total", role="router", finished_reason="length"), n)
            self.assertEqual(r.value("pdserve_request_failures_total", code="INVALID_ARGUMENT"), 1)
            self.assertEqual(r.value("pdserve_prompt_tokens_total", role="router"), sum(map(len, ps)))
            self.assertEqual(r.value("pdserve_generation_tokens_total", role="router"), sum(lengths))
            self.assertEqual(r.value("pdserve_router_decisions_total", tier="decode", policy="kv_aware",
                                     worker=c.decode[0].grpc), n)
            self.assertEqual(r.value("pdserve_router_decisions_total", tier="prefill",
                                     worker=c.prefill[0].grpc), n)
            self.assertEqual(r.value("pdserve_router_remote_prefill_total"), n)
            self.assertEqual(r.value("pdserve_router_local_prefill_total"), 0)
            self.assertEqual(r.value("pdserve_worker_up", tier="decode", worker=c.decode[0].grpc), 1)
            self.assertEqual(r.value("pdserve_worker_up", tier="prefill", worker=c.prefill[0].grpc), 1)
            self.assertEqual(r.value("pdserve_num_requests_running", role="router"), 0)
            self.assertEqual(r.value("pdserve_build_info"), 1)
            self.assertEqual(r.value("pdserve_http_responses_total", role="router", code="200"), 1)
            self.assertEqual(r.value("pdserve_http_connections_total", role="router"), 1)
            self.assertIn("version", dict(next(ls for (nm, ls) in r.samples if nm == "pdserve_build_info")))

            # KV transfers: bytes computed from the prompts, and equal to the workers' own totals
            # (the sums of the transfer summaries). The first transfer was refused.
            d_info, p_info = info(c.decode[0].grpc, False), info(c.prefill[0].grpc, True)
            self.assertEqual(d.value("pdserve_kv_transfer_bytes_total", role="decode"),
                             sum(transfer_bytes(q) for q in ps[1:]))
            self.assertEqual(d.value("pdserve_kv_transfer_bytes_total", role="decode"), d_info.transfer_bytes)
            self.assertEqual(p.value("pdserve_kv_transfer_bytes_total", role="prefill"),
                             sum(transfer_bytes(q) for q in ps))
            self.assertEqual(p.value("pdserve_kv_transfer_bytes_total", role="prefill"), p_info.transfer_bytes)
            self.assertEqual(d.value("pdserve_kv_transfers_total", role="decode"), n - 1)
            self.assertEqual(d.value("pdserve_kv_transfer_seconds_count", role="decode"), n - 1)
            self.assertEqual(d.value("pdserve_kv_transfer_pages_total", role="decode"), d_info.transfer_pages)
            self.assertEqual(d.value("pdserve_kv_transfer_failures_total", reason="checksum_mismatch"), 1)
            self.assertEqual(d.value("pdserve_kv_transfer_failures_total"), 1)
            self.assertEqual(d.value("pdserve_kv_lease_expired_total"), 0)
            self.assertEqual(d.value("pdserve_kv_reservations_active"), 0)

            # The workers' requests, tokens and cache.
            self.assertEqual(d.value("pdserve_time_to_first_token_seconds_count", role="decode"), n)
            self.assertEqual(d.value("pdserve_request_success_total", role="decode", finished_reason="length"), n)
            self.assertEqual(d.value("pdserve_prompt_tokens_total", role="decode"), sum(map(len, ps)))
            self.assertEqual(d.value("pdserve_generation_tokens_total", role="decode"), sum(lengths))
            self.assertEqual(d.value("pdserve_request_decode_time_seconds_count", role="decode"), n)
            self.assertEqual(p.value("pdserve_request_success_total", role="prefill"), n)
            self.assertEqual(p.value("pdserve_prompt_tokens_total", role="prefill"), sum(map(len, ps)))
            for page, i, role in ((d, d_info, "decode"), (p, p_info, "prefill")):
                self.assertEqual(page.value("pdserve_prefix_cache_queries_total", role=role), i.prefix_query_tokens)
                self.assertEqual(page.value("pdserve_prefix_cache_hits_total", role=role), i.prefix_hit_tokens)
                self.assertEqual(page.value("pdserve_kv_cache_blocks", role=role), i.total_blocks)
                self.assertEqual(page.value("pdserve_kv_cache_config_info", role=role, kv_dtype="f32",
                                            block_size="16", bytes_per_token=str(i.kv_bytes_per_token),
                                            page_bytes=str(i.page_bytes)), 1)
                self.assertEqual(page.value("pdserve_numerics_info", role=role, numerics=i.numerics), 1)
                self.assertEqual(page.value("pdserve_kv_cache_usage_perc", role=role), 0)
                self.assertEqual(page.value("pdserve_num_requests_running", role=role), 0)
                self.assertEqual(page.value("pdserve_num_requests_waiting", role=role), 0)
                self.assertEqual(page.value("pdserve_num_preemptions_total", role=role), 0)
            self.assertGreater(d_info.prefix_query_tokens, 0)
            self.assertEqual(d.value("pdserve_time_to_first_token_seconds_count", role="decode") +
                             d.value("pdserve_inter_token_latency_seconds_count", role="decode"), sum(lengths))
            self.assertEqual(d.value("pdserve_spec_decode_num_drafts_total"), d_info.spec_drafts)
            self.assertEqual(d.value("pdserve_spec_decode_num_draft_tokens_total"), d_info.spec_draft_tokens)
            self.assertEqual(d.value("pdserve_spec_decode_num_accepted_tokens_total"), d_info.spec_accepted_tokens)
            for pos in range(3):
                self.assertEqual(d.value("pdserve_spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)),
                                 d_info.spec_accepted_by_position[pos])
            self.assertGreater(d_info.spec_draft_tokens, 0)

            # A client that cancels mid-stream ends as finished_reason "abort", everywhere.
            call = stub.Generate(request(prompts(1, 22, 50, 51)[0], 3000), timeout=60)
            next(call)
            call.cancel()
            cluster.wait_idle(self, [(p, True) for p in c.prefill] + [(d, False) for d in c.decode])
            deadline = time.time() + 10
            while True:
                later = {name: Exposition(scrape(proc.addresses["metrics"]))
                         for name, proc in (("router", c.router), ("prefill", c.prefill[0]), ("decode", c.decode[0]))}
                if later["decode"].value("pdserve_request_success_total", finished_reason="abort") == 1 \
                        or time.time() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(later["router"].value("pdserve_request_success_total", finished_reason="abort"), 1,
                             [l for l in later["router"].text.splitlines() if "success" in l or "failures" in l])
            self.assertEqual(later["decode"].value("pdserve_request_success_total", finished_reason="abort"), 1)
            self.assertEqual(later["router"].value("pdserve_time_to_first_token_seconds_count", role="router"), n + 1)
            # Counters never go backwards across scrapes.
            for name in pages:
                before, after = pages[name].monotonic_series(), later[name].monotonic_series()
                self.assertGreater(len(before), 20)
                for key, v in before.items():
                    self.assertIn(key, after)
                    self.assertGreaterEqual(after[key], v, key)

            # Every name the dashboard and the alert rules use is one these processes export.
            exported = set()
            for page in later.values():
                for family, kind in page.types.items():
                    exported.add(family)
                    if kind == "histogram":
                        exported |= {family + "_bucket", family + "_count", family + "_sum"}
            used = used_metric_names()
            self.assertGreater(len(used), 20)
            self.assertEqual(sorted(used - exported), [])
        finally:
            self.assertEqual(c.stop(), [0] * 3)

    def test_a_real_prometheus_scrapes_serve(self):
        serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0",
                                          "--threads", "1", "--kv-memory-gib", "0.05",
                                          "--local-prefill-tokens", "4", *METRICS,
                                          "--metrics-compat", "vllm", "--compute-dtype", "bf16"])
        prom_dir = tempfile.mkdtemp(prefix="pdserve_prom_", dir=WORKDIR)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            prom_port = s.getsockname()[1]
        with open(os.path.join(prom_dir, "prometheus.yml"), "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {ALERTS}
scrape_configs:
  - job_name: pdserve
    static_configs:
      - targets: ["{serve.addresses['metrics']}"]
""")
        with open(os.path.join(prom_dir, "log"), "w") as log:
            prom = subprocess.Popen(["prometheus", f"--config.file={prom_dir}/prometheus.yml",
                                     f"--storage.tsdb.path={prom_dir}/data",
                                     f"--web.listen-address=127.0.0.1:{prom_port}"],
                                    stdout=subprocess.DEVNULL, stderr=log)
        api = f"http://127.0.0.1:{prom_port}/api/v1"

        def query(q):
            url = f"{api}/query?" + urllib.parse.urlencode({"query": q})
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
            self.assertEqual(body["status"], "success", body)
            return [float(x["value"][1]) for x in body["data"]["result"]]

        def wait_for(q, want, timeout=30):
            deadline = time.time() + timeout
            got = None
            while time.time() < deadline:
                try:
                    got = query(q)
                    if got == [want]:
                        return
                except OSError:
                    pass  # Not up yet.
                time.sleep(0.25)
            self.fail(f"{q}: Prometheus says {got}, want [{want}]")

        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(serve.grpc))
            ps = prompts(5, 31, 40, 150)
            for q in ps:
                self.assertEqual(len(generate(stub, q, 4)), 4)
            admin = worker_pb2_grpc.RouterAdminStub(grpc.insecure_channel(serve.grpc))
            # The decode worker's transfer summaries' sum, from the router's view of it (pushed
            # every 20 ms: wait for the report that includes the last transfer).
            deadline = time.time() + 10
            while True:
                worker = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10).decode[0].info
                if worker.transfers_completed == len(ps) or time.time() > deadline:
                    break
                time.sleep(0.05)
            summaries = worker.transfer_bytes
            self.assertEqual(summaries, sum(transfer_bytes(q) for q in ps))
            # Its arithmetic (--compute-dtype bf16): AMX's order where the CPU's flags have AMX-BF16,
            # VDPBF16PS's otherwise (by the instruction or its AVX2 twin). One worker: none mixed.
            with open("/proc/cpuinfo") as f:
                flags = set(next(l for l in f if l.startswith("flags")).split())
            self.assertEqual(worker.numerics,
                             "bf16/amx" if {"amx_bf16", "amx_tile"} <= flags else "bf16/vdpbf16ps")
            self.assertEqual(admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(),
                                                  timeout=10).mixed_numerics_workers, 0)
            wait_for('pdserve_time_to_first_token_seconds_count{role="router"}', len(ps))
            wait_for('pdserve_kv_transfer_bytes_total{role="decode"}', summaries)
            wait_for('vllm:time_to_first_token_seconds_count{role="router"}', len(ps))
            wait_for('sum(pdserve_request_success_total{role="router"})', len(ps))
            wait_for('up{job="pdserve"}', 1)
            # The alert rules load and evaluate in a real Prometheus; none fires.
            deadline = time.time() + 20
            while True:
                with urllib.request.urlopen(f"{api}/rules", timeout=10) as r:
                    rules = [rule for g in json.load(r)["data"]["groups"] for rule in g["rules"]]
                if rules and all(rule.get("lastEvaluation", "").startswith("20") for rule in rules) \
                        or time.time() > deadline:
                    break
                time.sleep(0.25)
            self.assertEqual(len(rules), 6)
            for rule in rules:
                self.assertEqual(rule["health"], "ok", rule)
                self.assertEqual(rule["state"], "inactive", rule)
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            self.assertEqual(serve.stop(), 0)

    def test_alert_rules_pass_promtool(self):
        r = subprocess.run(["promtool", "check", "rules", ALERTS], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS: 6 rules found", r.stdout)
        # Unit tests: each alert fires on the series that should raise it, and only those.
        r = subprocess.run(["promtool", "test", "rules", ALERTS_TEST], capture_output=True, text=True,
                           cwd=os.path.dirname(ALERTS_TEST))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_bad_metrics_flags_are_usage_errors(self):
        r = subprocess.run([PDSERVE, "decode", "--model", MODEL, "--listen", "127.0.0.1:0",
                            "--threads", "1", "--kv-memory-gib", "0.05", "--metrics-listen", "127.0.0.1:0",
                            "--metrics-compat", "prometheus-cpp"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--metrics-compat", r.stderr)
        r = subprocess.run([PDSERVE, "decode", "--model", MODEL, "--listen", "127.0.0.1:0",
                            "--threads", "1", "--kv-memory-gib", "0.05", "--metrics-listen", "nohostport"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--metrics-listen", r.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_metrics_")
    MODEL = os.path.join(WORKDIR, "model")
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "llama", "--layers", str(LAYERS),
                    "--hidden", str(HIDDEN), "--heads", str(HEADS), "--kv-heads", str(KV_HEADS),
                    "--vocab", "512", "--seed", "3"], check=True, capture_output=True)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
