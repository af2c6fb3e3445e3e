"""The KV cache tiers' load path against the machine's own tools (issue 59): DiskTier reading
blocks back in the engine's runs (bench/kv_tier_io_bench.cc) against `fio` reading the same bytes
sequentially from the same file system at the block's size, page cache dropped (cold) and kept
(warm); RedisTier's pipelined runs against `redis-benchmark` GETs of the block's size pipelined as
deep, one connection each, on the same redis-server (the tool's best of one GET at a time, the
tier's window and the whole run); a run loaded in one pipelined call against
the same blocks one call at a time; and HostTier's loads (checked, copied out as into a pool)
against memcpy of the same bytes. With --tls, the Redis rows go over TLS (a redis-server with a
TLS port only; the tier through its bridge, redis-benchmark with --tls), certificates made here
with the openssl command.

Run (as root for the cold figures; `apt-get install fio` first):
  /usr/bin/python3 bench/kv_tier_io.py --bench build/bench/kv_tier_io_bench [--block-bytes 524288] [--blocks 512] [--tls]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import cluster  # noqa: E402


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fio(path, block, total, cold):
    if cold and not drop_caches():
        return None
    out = subprocess.run(["fio", "--name=seq", f"--filename={path}", "--rw=read", f"--bs={block}", f"--size={total}",
                          "--ioengine=psync", "--direct=0", "--output-format=json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["jobs"][0]["read"]["bw_bytes"] / 1e6


def redis_benchmark(port, block, n, pipeline, tls_certs=None):
    tls = []
    if tls_certs:
        tls = ["--tls", "--cacert", os.path.join(tls_certs, "ca.pem"), "--cert", os.path.join(tls_certs, "node.pem"),
               "--key", os.path.join(tls_certs, "node.key")]
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "set,get", "-d", str(block), "-n", str(n),
                          "-P", str(pipeline), "-c", "1", "--csv", *tls], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells[0] == "GET":
            return float(cells[1]) * block / 1e6
    raise AssertionError(f"no GET line in {out!r}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench", required=True)
    p.add_argument("--block-bytes", type=int, default=512 * 1024)
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--run", type=int, default=64)
    p.add_argument("--dir", default=None, help="the file system to measure (default: a temporary directory)")
    p.add_argument("--tls", action="store_true", help="the Redis rows over TLS")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="kv_tier_io_", dir=a.dir)
    certs, tls_flags = None, []
    if a.tls:
        certs = os.path.join(work, "certs")
        os.makedirs(certs)
        cluster.make_ca(certs, "ca")
        cluster.make_leaf(certs, "node", "ca")
        tls_flags = ["--tls-ca", os.path.join(certs, "ca.pem")]
    redis = cluster.RedisServer(tls_certs=certs)
    try:
        ours = json.loads(subprocess.run([a.bench, "--dir", os.path.join(work, "tier"), "--redis", redis.url, *tls_flags,
                                          "--block-bytes", str(a.block_bytes), "--blocks", str(a.blocks), "--run", str(a.run)],
                                         capture_output=True, text=True, check=True).stdout)
        total = a.block_bytes * a.blocks
        data = os.path.join(work, "fio.dat")
        subprocess.run(["fio", "--name=fill", f"--filename={data}", "--rw=write", f"--bs={a.block_bytes}",
                        f"--size={total}", "--output-format=json"], capture_output=True, check=True)
        fio_cold = fio(data, a.block_bytes, total, cold=True)
        fio_warm = fio(data, a.block_bytes, total, cold=False)
        # The tool at its best: one GET at a time, the tier's window (8 MiB of replies), the run.
        window = max(1, (8 << 20) // (a.block_bytes + 96))
        rb = max((redis_benchmark(redis.port, a.block_bytes, a.blocks * 4, depth, certs), depth)
                 for depth in sorted({1, window, a.run}))
    finally:
        redis.kill()
        shutil.rmtree(work, ignore_errors=True)

    def ratio(x, y):
        return f"{x / y:.2f}" if x and y else "n/a"

    def mbps(x):
        return f"{x:,.0f} MB/s" if x else "n/a"

    print(f"blocks of {a.block_bytes:,} bytes, {a.blocks} of them, runs of {a.run}{', Redis over TLS' if a.tls else ''}")
    print("| measurement | pdserve's tier | the tool | ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| host memory (checked, copied out) | {mbps(ours['host_mbps'])} | memcpy {mbps(ours['memcpy_mbps'])} | "
          f"{ratio(ours['host_mbps'], ours['memcpy_mbps'])} |")
    print(f"| host memory: the check alone (XXH3-64) | {mbps(ours['xxh3_mbps'])} | memcpy {mbps(ours['memcpy_mbps'])} | "
          f"{ratio(ours['xxh3_mbps'], ours['memcpy_mbps'])} |")
    print(f"| disk, page cache dropped | {mbps(ours['disk_cold_mbps'])} | fio {mbps(fio_cold)} | "
          f"{ratio(ours['disk_cold_mbps'], fio_cold)} |")
    print(f"| disk, page cache warm | {mbps(ours['disk_warm_mbps'])} | fio {mbps(fio_warm)} | "
          f"{ratio(ours['disk_warm_mbps'], fio_warm)} |")
    print(f"| redis, runs of {a.run} | {mbps(ours['redis_run_mbps'])} | redis-benchmark -c 1 -P {rb[1]} (its best) "
          f"{mbps(rb[0])} | {ratio(ours['redis_run_mbps'], rb[0])} |")
    print(f"| redis, a run in one call vs one call a block | {mbps(ours['redis_run_mbps'])} | "
          f"{mbps(ours['redis_one_at_a_time_mbps'])} | {ratio(ours['redis_run_mbps'], ours['redis_one_at_a_time_mbps'])} |")


if __name__ == "__main__":
    main()
