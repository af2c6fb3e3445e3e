#!/usr/bin/python3
"""How long each thread of a running command waited for a core (Linux schedstat): runs the
command, samples /proc/PID/task/*/schedstat of it and its children twice, --skip seconds after
the start and --window seconds later, and prints per thread the time it ran and the time it sat
runnable without a core, then the totals. On a machine with fewer cores than busy threads (this
project's 2-core machines running a router, a prefill and a decode worker and the load client)
the wait is the share of a step's time that is time-sharing, which the capacity simulator does
not model and a deployment with a device per worker does not have.

  /usr/bin/python3 bench/sched_wait.py --skip 14 --window 30 -- build/pdserve bench \
      --compare-policies kv_aware --model M --prefill 1 --decode 1 --worker-flags '--threads 1' \
      --workload random --input-len 256 --output-len 64 --num-prompts 60 --request-rate 1.5
"""
import argparse
import glob
import os
import subprocess
import sys
import time


def threads(root):
    """{(pid, tid): (name, run ns, wait ns)} of root and its children."""
    pids = [root]
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(path) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == root:  # ppid
                pids.append(int(path.split("/")[2]))
        except (OSError, IndexError, ValueError):
            pass
    out = {}
    for pid in pids:
        try:  # The tier, for pdserve's children (/proc/self/exe prefill ...).
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            role = argv[1].decode() if len(argv) > 1 and pid != root else "client"
        except OSError:
            role = "?"
        for task in glob.glob(f"/proc/{pid}/task/*"):
            try:
                with open(os.path.join(task, "comm")) as f:
                    name = f.read().strip()
                with open(os.path.join(task, "schedstat")) as f:
                    run, wait, _ = (int(x) for x in f.read().split())
                out[(pid, int(os.path.basename(task)))] = (f"{role}/{name}", run, wait)
            except (OSError, ValueError):
                pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip", type=float, default=10, help="seconds after the start before the window")
    ap.add_argument("--window", type=float, default=30, help="seconds sampled")
    ap.add_argument("--min-seconds", type=float, default=0.2, help="list threads that ran or waited this long")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        sys.exit("sched_wait: give the command after --")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    time.sleep(args.skip)
    before = threads(proc.pid)
    time.sleep(args.window)
    after = threads(proc.pid)
    proc.wait()
    cores = os.cpu_count()
    print("| process/thread, tid | ran (s) | waited for a core (s) | waited / ran |\n| --- | --- | --- | --- |")
    total_run = total_wait = 0.0
    for key, (name, run, wait) in sorted(after.items()):
        if key not in before:
            continue
        r = (run - before[key][1]) / 1e9
        w = (wait - before[key][2]) / 1e9
        total_run += r
        total_wait += w
        if r >= args.min_seconds or w >= args.min_seconds:
            print(f"| {name} {key[1]} | {r:.2f} | {w:.2f} | {w / r if r else float('inf'):.2f} |")
    print(f"| all threads ({args.window:.0f} s on {cores} cores) | {total_run:.2f} | {total_wait:.2f} | "
          f"{total_wait / total_run if total_run else 0:.2f} |")


if __name__ == "__main__":
    main()
