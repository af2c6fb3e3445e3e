"""Where a disaggregated request's TTFT goes, from its OpenTelemetry spans: runs `pdserve bench
--compare-policies kv_aware` on a local 1P1D cluster with every tier exporting OTLP to a
collector in this script (decoded with OpenTelemetry's own protos, as tests/e2e/test_tracing.py
does), and prints, per span of the request (docs/guide/monitoring.md, "Tracing"), the p50 and mean of its start,
end and duration in ms from the router's `pdserve.generate` start, and the TTFT (its first_token
event).

Run: /usr/bin/python3 bench/ttft_breakdown.py --pdserve build/pdserve --model DIR [--rate 0.5]
"""

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import test_tracing  # noqa: E402  (its collector and OTLP protos)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rate", default="0.5")
    ap.add_argument("--num-prompts", default="20")
    ap.add_argument("--input-len", default="256")
    ap.add_argument("--output-len", default="64")
    ap.add_argument("--worker-flags", default="--threads 1")
    a = ap.parse_args()
    test_tracing.WORKDIR = tempfile.mkdtemp(prefix="ttft_breakdown_")
    test_tracing.OTLP = test_tracing.load_otlp()
    collector = test_tracing.Collector()
    traced = f" --otlp-traces-endpoint {collector.url}"
    out = subprocess.run([a.pdserve, "bench", "--compare-policies", "kv_aware", "--model", a.model,
                          "--prefill", "1", "--decode", "1", "--worker-flags", a.worker_flags + traced,
                          "--router-flags", traced, "--num-prompts", a.num_prompts,
                          "--request-rate", a.rate, "--input-len", a.input_len,
                          "--output-len", a.output_len, "--format", "json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr[-3000:])
    time.sleep(2)  # The last spans' batch.
    collector.close()
    by_trace = collections.defaultdict(list)
    for _, span in collector.spans:
        by_trace[span.trace_id].append(span)
    rows = collections.defaultdict(list)
    for spans in by_trace.values():
        top = [s for s in spans if s.name == "pdserve.generate"]
        first = [e for s in top for e in s.events if e.name == "first_token"]
        if not first:
            continue
        t0 = top[0].start_time_unix_nano
        rows["(ttft)", "end"].append((first[0].time_unix_nano - t0) / 1e6)
        for s in spans:
            rows[s.name, "start"].append((s.start_time_unix_nano - t0) / 1e6)
            rows[s.name, "end"].append((s.end_time_unix_nano - t0) / 1e6)
            rows[s.name, "duration"].append((s.end_time_unix_nano - s.start_time_unix_nano) / 1e6)
    print(f"{len(by_trace)} requests; ms from the router's pdserve.generate start")
    print(f"{'span':34s} {'start p50':>10s} {'end p50':>10s} {'dur p50':>10s} {'dur mean':>10s}")
    names = sorted({n for n, _ in rows}, key=lambda n: statistics.median(rows[n, "end"]))
    for n in names:
        start = statistics.median(rows[n, "start"]) if rows[n, "start"] else float("nan")
        dur = rows[n, "duration"] or [float("nan")]
        print(f"{n:34s} {start:10.2f} {statistics.median(rows[n, 'end']):10.2f} "
              f"{statistics.median(dur):10.2f} {statistics.mean(dur):10.2f}")


if __name__ == "__main__":
    main()
