"""Smoke runs of the benchmark commands (tiny model, few requests; no timing is asserted): the
output parses, the counts equal what was sent, the rates are positive, plot.sh draws a PNG, and
bad flags exit 2 naming the flag. Benchmarks are never timed in CI; bench/RESULTS.md has figures.

Run: /usr/bin/python3 tests/e2e/test_bench.py --pdserve build/pdserve
"""

import argparse
import csv
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

PDSERVE = None
MODEL = None
WORKDIR = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def proc_cpu_seconds(pid):
    """utime + stime of a process, from the kernel (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(*args, check=True):
    out = subprocess.run([PDSERVE, *args], capture_output=True, text=True, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"pdserve {' '.join(args)} exited {out.returncode}: {out.stderr[-3000:]}")
    return out


class BenchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0",
                                              "--threads", "1", "--kv-blocks", "256"])

    @classmethod
    def tearDownClass(cls):
        cls.serve.stop()

    def test_serving_bench_sweep_json_csv_and_plot(self):
        path = os.path.join(WORKDIR, "sweep.csv")
        out = run("bench", "--server", self.serve.grpc, "--workload", "random", "--num-prompts", "6",
                  "--input-len", "16", "--output-len", "4", "--sweep", "8,inf",
                  "--goodput", "ttft:60000 tpot:60000", "--csv", path, "--format", "json")
        rows = json.loads(out.stdout)
        self.assertEqual([r["request_rate"] for r in rows], [8, "inf"])
        for r in rows:
            self.assertEqual((r["ok"], r["failed"]), (6, 0), r)
            self.assertIsInstance(r["completion_tokens"], int)  # Counts are integers.
            self.assertEqual(r["prompt_tokens"], 6 * 16)
            self.assertEqual(r["completion_tokens"], 6 * 4)
            self.assertEqual(r["good"], 6)  # SLOs of a minute: every request meets them.
            for key in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p50_ms",
                        "e2el_p99_ms", "requests_per_second", "output_tokens_per_second",
                        "total_tokens_per_second", "goodput", "duration_s"):
                self.assertGreater(r[key], 0, key)
            self.assertLessEqual(r["ttft_p50_ms"], r["ttft_p99_ms"])
            self.assertLessEqual(r["ttft_p99_ms"], r["e2el_p99_ms"])
            self.assertAlmostEqual(r["total_tokens_per_second"] / r["output_tokens_per_second"],
                                   (16 + 4) / 4, places=6)
        with open(path) as f:
            table = list(csv.DictReader(f))
        self.assertEqual([t["request_rate"] for t in table], ["8", "inf"])
        self.assertEqual(table[0]["completion_tokens"], "24")
        # gnuplot-nox is scripts/setup.sh's: required, not left out when missing.
        png = os.path.join(WORKDIR, "sweep.png")
        subprocess.run([os.path.join(ROOT, "bench", "plot.sh"), png, path], check=True,
                       capture_output=True, timeout=120)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_serving_bench_text_chat_and_concurrency(self):
        out = run("bench", "--server", self.serve.grpc, "--workload", "synthetic-chat",
                  "--num-prompts", "8", "--input-len", "12", "--output-len", "3",
                  "--request-rate", "50", "--burstiness", "0.5", "--max-concurrency", "2")
        self.assertIn("Serving Benchmark Result", out.stdout)
        self.assertIn("Successful requests:                     8", out.stdout)
        self.assertIn("Time to First Token", out.stdout)

    def test_max_concurrency_one_runs_requests_one_after_another(self):
        out = run("bench", "--server", self.serve.grpc, "--num-prompts", "4", "--input-len", "8",
                  "--output-len", "3", "--max-concurrency", "1", "--format", "json")
        r = json.loads(out.stdout)[0]
        self.assertEqual(r["ok"], 4)
        # One stream: the run lasts at least the sum of the requests' latencies.
        self.assertGreaterEqual(r["duration_s"] * 1000, 4 * r["e2el_mean_ms"] * 0.999)

    def test_serving_bench_reports_each_processs_cpu_per_token(self):
        """--cpu-metrics: the router's and the decode worker's CPU per output token, from their
        process_cpu_seconds_total, against the kernel's own count (/proc/PID/stat) over the run."""
        c = cluster.Cluster(PDSERVE, MODEL, prefill=0, decode=1,
                            engine_args=("--threads", "1", "--kv-memory-gib", "0.05", "--metrics-listen", "127.0.0.1:0"),
                            router_args=("--metrics-listen", "127.0.0.1:0"))
        try:
            procs = {"router": c.router, "decode": c.decode[0]}
            before = {n: proc_cpu_seconds(p.proc.pid) for n, p in procs.items()}
            started = time.monotonic()
            out = run("bench", "--server", c.router.grpc, "--num-prompts", "32", "--max-concurrency", "16",
                      "--input-len", "16", "--output-len", "64", "--format", "json", "--cpu-metrics",
                      ",".join(f"{n}={p.addresses['metrics']}" for n, p in procs.items()))
            wall = time.monotonic() - started
            after = {n: proc_cpu_seconds(p.proc.pid) for n, p in procs.items()}
            r = json.loads(out.stdout)[0]
            # The decode worker's engine stepped (one scheduler thread: at most the wall time).
            step = r["engine_step_us_per_output_token"]
            self.assertEqual(list(step), ["decode"])
            self.assertGreater(step["decode"], 0)
            self.assertLess(step["decode"], wall / (32 * 64) * 1e6)
            self.assertEqual(r["completion_tokens"], 32 * 64)
            cpu = r["cpu_us_per_output_token"]
            self.assertEqual(sorted(cpu), ["decode", "router"])
            for name in procs:
                kernel = (after[name] - before[name]) / (32 * 64) * 1e6
                # The kernel's figure spans the bench's start and end too (and ticks are 10 ms).
                self.assertGreater(cpu[name], 0, name)
                self.assertLessEqual(cpu[name], kernel + 0.02 / (32 * 64) * 1e6, (name, cpu[name], kernel))
                self.assertGreater(cpu[name], 0.5 * kernel - 0.02 / (32 * 64) * 1e6, (name, cpu[name], kernel))
            text = run("bench", "--server", c.router.grpc, "--num-prompts", "4", "--input-len", "8",
                       "--output-len", "4", "--cpu-metrics", f"router={c.router.addresses['metrics']}").stdout
            self.assertIn("CPU per output token (us), router:", text)
            self.assertNotIn("of which engine steps", text)
            bad = run("bench", "--server", c.router.grpc, "--num-prompts", "2", "--input-len", "8",
                      "--output-len", "2", "--cpu-metrics", "router=127.0.0.1:1", check=False)
            self.assertEqual(bad.returncode, 1, bad.stderr)
            self.assertIn("router (http://127.0.0.1:1/metrics) did not answer", bad.stderr)
        finally:
            self.assertEqual(c.stop(), [0, 0])

    def test_serving_bench_replays_a_trace(self):
        # A Mooncake-format trace (../shared/traces/README.md) with lengths x 1/32: 512-token
        # blocks become 16-token cache blocks, so equal hash_ids are a shared prefix the cache hits.
        lines = [(0, 1024, 3, [7, 8]), (300, 1600, 4, [7, 8, 9, 10]), (600, 900, 2, [11, 12]),
                 (900, 512, 5, [7]), (1200, 700, 3, [13, 14])]
        path = os.path.join(WORKDIR, "trace.jsonl")
        with open(path, "w") as f:
            for ts, n, out, ids in lines:
                f.write(json.dumps({"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}) + "\n")
        out = run("bench", "--server", self.serve.grpc, "--workload", "trace", "--trace", path,
                  "--trace-length-scale", "0.03125", "--trace-time-scale", "0.5", "--format", "json")
        r = json.loads(out.stdout)[0]
        self.assertEqual((r["ok"], r["failed"]), (len(lines), 0), r)
        self.assertIsNone(r["request_rate"])  # The trace's own arrivals, not a rate.
        self.assertEqual(r["prompt_tokens"], sum(round(n / 32) for _, n, _, _ in lines))
        self.assertEqual(r["completion_tokens"], sum(o for _, _, o, _ in lines))
        # Requests 2 and 4 start with request 1's blocks (2 of 16 tokens, and 1).
        self.assertGreater(r["hit_rate"], 0)
        self.assertGreaterEqual(r["duration_s"], 1.2 * 0.5)  # The last arrival, time-scaled.
        # The first two lines only, at their own pace; a line past the model's context is refused.
        out = run("bench", "--server", self.serve.grpc, "--workload", "trace", "--trace", path,
                  "--trace-length-scale", "0.03125", "--trace-max-requests", "2", "--format", "json")
        self.assertEqual(json.loads(out.stdout)[0]["ok"], 2)
        # A trace that starts a minute in: the replay starts with its first request, not a minute
        # later, and keeps the gaps (1.2 s x 0.5).
        late = os.path.join(WORKDIR, "late_trace.jsonl")
        with open(late, "w") as f:
            for ts, n, o, ids in lines:
                f.write(json.dumps({"timestamp": 60000 + ts, "input_length": n, "output_length": o,
                                    "hash_ids": ids}) + "\n")
        out = run("bench", "--server", self.serve.grpc, "--workload", "trace", "--trace", late,
                  "--trace-length-scale", "0.03125", "--trace-time-scale", "0.5", "--format", "json")
        r = json.loads(out.stdout)[0]
        self.assertEqual(r["ok"], len(lines))
        self.assertGreaterEqual(r["duration_s"], 1.2 * 0.5)
        self.assertLess(r["duration_s"], 20)
        with open(path, "a") as f:
            f.write(json.dumps({"timestamp": 1500, "input_length": 200000, "output_length": 1, "hash_ids": []}) + "\n")
        out = run("bench", "--server", self.serve.grpc, "--workload", "trace", "--trace", path,
                  "--trace-length-scale", "0.03125", check=False)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("--trace: request 6", out.stderr)
        self.assertIn("context", out.stderr)

    def test_serving_bench_reports_speculative_acceptance(self):
        serve = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                          "--kv-blocks", "256", "--speculative", "ngram",
                                          "--num-speculative-tokens", "3", "--spec-ngram-min", "1",
                                          # Drafts that do not hang on this machine's step times.
                                          "--spec-step-budget=false"])
        try:
            runs = []
            for _ in range(2):
                out = run("bench", "--server", serve.grpc, "--num-prompts", "6", "--input-len", "16",
                          "--output-len", "40", "--format", "json")
                runs.append(json.loads(out.stdout)[0])
            text = run("bench", "--server", serve.grpc, "--num-prompts", "2", "--input-len", "16",
                       "--output-len", "40").stdout
        finally:
            self.assertEqual(serve.stop(), 0)
        for r in runs:
            self.assertEqual((r["ok"], r["completion_tokens"]), (6, 240), r)
            # The run's own drafts (counters after minus before). How many there are is not
            # fixed: the batches the bench's arrivals make differ between runs (and with the
            # step budget on, the default, the measured cost of this machine's steps decides
            # too). Each draft is verified in a decode step that yields at least one token, and
            # a request's first token comes from its prefill: at most 240 - 6 drafts per run
            # (the second run's figure would pass that if the counters were the server's totals).
            self.assertGreaterEqual(r["spec_drafts"], 0, r)
            self.assertLessEqual(r["spec_drafts"] + r["spec_accepted_tokens"], 240 - 6, r)
            self.assertLessEqual(r["spec_accepted_tokens"], r["spec_draft_tokens"])
            self.assertLessEqual(r["spec_draft_tokens"], 3 * r["spec_drafts"])
            drafts, tokens = max(r["spec_drafts"], 1), max(r["spec_draft_tokens"], 1)
            self.assertAlmostEqual(r["spec_acceptance_rate"], r["spec_accepted_tokens"] / tokens)
            self.assertAlmostEqual(r["spec_mean_acceptance_length"], 1 + r["spec_accepted_tokens"] / drafts)
            self.assertEqual(len(r["spec_acceptance_by_position"]), 3)
            self.assertAlmostEqual(sum(r["spec_acceptance_by_position"]) * drafts, r["spec_accepted_tokens"])
        # No step budget: every draft the adaptation allows runs, and a 1-token n-gram over 16
        # random prompt tokens and 40 outputs finds matches.
        self.assertGreater(runs[0]["spec_drafts"], 0, runs)
        # The text report has the lines whenever the decode tier speculates, drafts or not.
        self.assertRegex(text, r"Speculative acceptance rate: +[0-9.]+ \([0-9]+ of [0-9]+ drafted\)")
        self.assertRegex(text, r"Mean acceptance length: +[0-9.]+")
        # Without speculation, nothing is reported.
        self.assertNotIn("spec_drafts", json.loads(run("bench", "--server", self.serve.grpc, "--num-prompts", "2",
                                                       "--input-len", "8", "--output-len", "4",
                                                       "--format", "json").stdout)[0])

    def test_engine_bench_json(self):
        out = run("bench-engine", "--model", MODEL, "--batch", "2", "--input-len", "16",
                  "--output-len", "4", "--threads", "1", "--kv-blocks", "64", "--bw-gib", "0.125",
                  "--sgemm-n", "128", "--format", "json")
        j = json.loads(out.stdout)
        for key in ("decode_tok_s", "prefill_tok_s", "decode_bw_ratio", "prefill_flops_ratio",
                    "read_bw_gbs", "sgemm_gflops", "decode_forward_share"):
            self.assertGreater(j[key], 0, key)
        # Each share is timed on its own (disjoint parts of a step): none can pass the whole, and
        # the scheduler's own work must stay a small part of a step (it is ~0.01% at batch 16).
        shares = [j[k] for k in ("decode_forward_share", "decode_sampling_share", "decode_scheduler_share")]
        for share in shares:
            self.assertGreater(share, 0)
        self.assertLessEqual(sum(shares), 1.0 + 1e-9)
        self.assertLess(j["decode_scheduler_share"], 0.25)
        # The fastest of --prefill-rounds (3) prefills, the first among them.
        self.assertEqual(j["prefill_rounds"], 3)
        self.assertGreaterEqual(j["prefill_tok_s"], j["prefill_first_tok_s"])
        self.assertGreater(j["decode_bw_ratio_median_step"], 0)
        # The forward passes' time by phase: shares of one whole, the projections and attention in it.
        for key in ("prefill_phase_shares", "decode_phase_shares"):
            phases = j[key]
            self.assertAlmostEqual(sum(phases.values()), 1.0, places=9)
            for phase in ("qkv", "attention", "gate_up", "down"):
                self.assertGreater(phases[phase], 0, (key, phase))
        bad = subprocess.run([PDSERVE, "bench-engine", "--model", MODEL, "--prefill-rounds", "0"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertIn("--prefill-rounds", bad.stderr)

    def test_engine_bench_reads_between_its_steps(self):
        """--bw-every N: a read of the machine's memory after every N decode steps, each window of N
        steps judged against the read that followed it, and a read of the weights' own memory
        likewise. 10 tokens out: 9 decode steps, reads after the 4th and the 8th (none after the
        last step), so 2 windows."""
        common = ["--model", MODEL, "--batch", "2", "--input-len", "16", "--output-len", "10",
                  "--threads", "1", "--kv-blocks", "64", "--bw-gib", "0.125", "--sgemm-n", "128",
                  "--prefill-rounds", "1", "--format", "json"]
        j = json.loads(run("bench-engine", *common, "--bw-every", "4").stdout)
        self.assertEqual((j["decode_steps"], j["decode_bw_windows"]), (9, 2))
        self.assertGreater(j["read_bw_between_gbs"], 0)
        self.assertGreater(j["decode_bw_ratio_between"], 0)
        self.assertGreater(j["read_bw_weights_between_gbs"], 0)
        self.assertGreater(j["decode_bw_ratio_weights_between"], 0)
        plain = json.loads(run("bench-engine", *common).stdout)
        for key in ("read_bw_between_gbs", "decode_bw_ratio_between", "decode_bw_windows",
                    "read_bw_weights_between_gbs", "decode_bw_ratio_weights_between"):
            self.assertNotIn(key, plain)
        static_only = "--bw-every: decode's bytes are counted for a static batch"
        for extra, message in ((["--bw-every", "-1"], "--bw-every: must be >= 0"),
                               (["--bw-every", "4", "--requests", "3"], static_only)):
            bad = subprocess.run([PDSERVE, "bench-engine", *common, *extra], capture_output=True,
                                 text=True, timeout=60)
            self.assertEqual(bad.returncode, 2, bad.stderr)
            self.assertIn(message, bad.stderr)

    def test_engine_bench_queues_requests_for_the_batchs_slots(self):
        """--requests above --batch: the requests take the batch's slots as they free, as a server's
        continuous batching runs them. 5 requests of 4 tokens through 2 slots: the first two decode
        3 steps after their prefill, the next two take the slots (a step that prefills and gives
        their first tokens, then 3), the last one alone (1 + 3): 11 steps."""
        common = ["--model", MODEL, "--batch", "2", "--input-len", "16", "--output-len", "4",
                  "--threads", "1", "--kv-blocks", "64", "--bw-gib", "0.125", "--sgemm-n", "128",
                  "--prefill-rounds", "1", "--format", "json"]
        j = json.loads(run("bench-engine", *common, "--requests", "5").stdout)
        self.assertEqual((j["requests"], j["batch"], j["decode_steps"]), (5, 2, 11))
        self.assertGreater(j["decode_tok_s"], 0)
        for key in ("decode_bw_ratio", "decode_bw_ratio_median_step", "decode_effective_gbs"):
            self.assertNotIn(key, j)  # They count bytes for a static batch.
        static = json.loads(run("bench-engine", *common).stdout)
        self.assertEqual((static["requests"], static["decode_steps"]), (2, 3))
        self.assertIn("decode_bw_ratio", static)
        bad = subprocess.run([PDSERVE, "bench-engine", *common, "--requests", "1"], capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertIn("--requests: 1 is fewer than --batch (2)", bad.stderr)

    def test_engine_bench_on_random_weights_of_a_shape(self):
        """--random-weights: the shape of a config.json (here the test model's) with synthetic bf16
        weights, no checkpoint read: the same KV layout as the model, and a decode step that
        streams exactly the bf16 bytes of the shape's matrices."""
        common = ["--batch", "2", "--input-len", "16", "--output-len", "4", "--threads", "1",
                  "--kv-blocks", "64", "--bw-gib", "0.125", "--sgemm-n", "128", "--format", "json"]
        config = os.path.join(MODEL, "config.json")
        j = json.loads(run("bench-engine", "--random-weights", config, *common).stdout)
        real = json.loads(run("bench-engine", "--model", MODEL, *common).stdout)
        self.assertEqual(j["model"], "random-weights:" + config)
        self.assertEqual(j["weights_dtype"], "bf16")
        self.assertEqual(j["kv_bytes_per_token"], real["kv_bytes_per_token"])
        with open(config) as f:
            c = json.load(f)
        h, i, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
        kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
        weight_bytes = 2 * (layers * (2 * h * h + 2 * h * kv + 3 * h * i) + vocab * h)
        # Each of the 3 decode steps reads the weights and every sequence's whole context of KV.
        kv_read = sum(2 * (16 + s) * j["kv_bytes_per_token"] for s in range(1, 4)) / 3
        self.assertAlmostEqual(j["decode_bytes_per_step"], weight_bytes + kv_read, delta=1)
        self.assertGreater(j["decode_tok_s"], 0)
        for args, text in ((["--model", MODEL, "--random-weights", "llama3-8b"], "one of --model"),
                           ([], "one of --model"),
                           (["--random-weights", "llama-9000"], "llama3-8b, llama3.1-8b")):
            out = subprocess.run([PDSERVE, "bench-engine", *args], capture_output=True, text=True,
                                 timeout=60)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn(text, out.stderr)

    def test_transport_bench_json(self):
        for transport, tls in (("tcp", None), ("local", None), ("ucx", "sm"), ("ucx", "tcp")):
            args = [PDSERVE, "bench-transport", "--transport", transport, "--bytes", str(4 << 20),
                    "--page-bytes", "4096", "--repeats", "1", "--format", "json"]
            env = dict(os.environ, UCX_TLS=f"{tls},self") if tls else None
            out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
            if transport == "ucx" and "not built in" in out.stderr:
                continue  # A build without libucx-dev (PDSERVE_UCX=OFF).
            self.assertEqual(out.returncode, 0, out.stderr)
            j = json.loads(out.stdout)
            if transport == "ucx":
                self.assertIn("memory" if tls == "sm" else "tcp/", j["transport_detail"])
            self.assertEqual(j["pages"], 1024)
            for key in ("kv_gb_s", "socket_gb_s", "memcpy_gb_s", "kv_socket_ratio"):
                self.assertGreater(j[key], 0, key)

    def test_ttft_disagg_script_leaves_no_process_behind(self):
        """bench/ttft_disagg.sh on the tiny model: it prints both runs and the ratio, and when it
        exits none of the four pdserve processes it started is still running (they outlived it
        when their pids were collected in a subshell)."""
        env = dict(os.environ, PDSERVE=PDSERVE)
        out = subprocess.run([os.path.join(ROOT, "bench", "ttft_disagg.sh"), MODEL, "64", "2", "1"],
                             capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        self.assertIn("TTFT ratio disaggregated / serve", out.stdout)
        self.assertIn("ok 2/2", out.stdout)
        # The processes it started carry this test's model path on their command line; the only
        # other one is this class's own `serve`.
        leftover = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if int(pid) != self.serve.proc.pid and argv[0].endswith(b"pdserve") and MODEL.encode() in argv:
                leftover.append(b" ".join(argv).decode(errors="replace"))
        self.assertEqual(leftover, [])

    def test_bad_flags_name_the_flag(self):
        cases = [
            (["bench", "--server", "127.0.0.1:1", "--goodput", "itl:5"], "--goodput"),
            (["bench", "--server", "127.0.0.1:1", "--request-rate", "0"], "--request-rate"),
            (["bench", "--server", "127.0.0.1:1", "--sweep", "1,x"], "--sweep"),
            (["bench", "--server", "127.0.0.1:1", "--workload", "sharegpt"], "--workload"),
            (["bench", "--server", "127.0.0.1:1", "--range-ratio", "1.5"], "--range-ratio"),
            (["bench-transport", "--transport", "rdma"], "--transport"),
            (["bench-transport", "--bytes", "10"], "--bytes"),
            (["bench-transport", "--bytes", str(64 << 30)], "--bytes"),
            (["bench", "--server", "127.0.0.1:1", "--num-prompts", "20000"], "--max-concurrency"),
            (["bench", "--server", "127.0.0.1:1", "--csv", "/nonexistent/dir/x.csv"], "--csv"),
            (["bench", "--server", "127.0.0.1:1", "--cpu-metrics", "router=nohost"], "--cpu-metrics"),
            (["bench", "--server", "127.0.0.1:1", "--cpu-metrics", "a=127.0.0.1:1,a=127.0.0.1:2"], "--cpu-metrics"),
            (["bench", "--compare-policies", "kv_aware", "--cpu-metrics", "127.0.0.1:1"], "--cpu-metrics"),
            (["bench", "--server", "127.0.0.1:1", "--workload", "trace"], "--trace"),
            (["bench", "--server", "127.0.0.1:1", "--trace", "/dev/null"], "--trace"),
            (["bench", "--server", "127.0.0.1:1", "--workload", "trace", "--trace", "/nonexistent.jsonl"], "--trace"),
            (["bench", "--server", "127.0.0.1:1", "--workload", "trace", "--trace", "/dev/null",
              "--request-rate", "2"], "--request-rate"),
        ]
        for args, flag in cases:
            out = run(*args, check=False)
            self.assertEqual(out.returncode, 2, (args, out.stderr))
            self.assertIn(flag, out.stderr, args)
        # A prompt that cannot fit the model's context is refused before anything is sent.
        out = run("bench", "--server", self.serve.grpc, "--input-len", "100000", check=False)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("context", out.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_bench_")
    MODEL = os.path.join(WORKDIR, "model")
    subprocess.run([PDSERVE, "make-model", MODEL, "--arch", "llama", "--layers", "2",
                    "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "512",
                    "--seed", "3"], check=True, capture_output=True)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
