#!/usr/bin/python3
"""What the test run left out, and a failure where this machine should not have left it out.

scripts/test.sh runs this after ctest (and scripts/fuzz.sh after the sanitizer build's tests):
  1. Skipped tests: every GoogleTest binary (common/testing/gtest_main.cc) and Python suite
     (tests/suite_main.py) records each skipped test in BUILD/skips/*.tsv. A skip's message starts
     with "needs <capability>:", and the skip is expected only where this machine lacks that
     capability (e.g. "needs avx512:" on a CPU with AVX-512 is a failure: the path went unchecked
     on the one machine that could check it). A skip that names no known capability fails too.
  2. Suites not built: UCX found (pkg-config ucx) but its suites absent; nvcc present but the CUDA
     targets absent. Where a CMake option left them out (-DPDSERVE_UCX=OFF, -DPDSERVE_CUDA=OFF)
     that is reported, and fails only under PDSERVE_REQUIRE_ALL=1 (what .ci/run sets).
  3. Extra lines from the caller (--left-out "what (why)"), e.g. the fuzzers under
     PDSERVE_SKIP_FUZZ=1; they fail under PDSERVE_REQUIRE_ALL=1.
  4. Tests written so that they never run or check nothing: a GoogleTest DISABLED_ test that no
     ctest entry runs (--gtest_also_run_disabled_tests with a filter naming it), and a Python
     test that leaves part of itself out when a tool is missing (`if shutil.which(...)`) instead
     of requiring it (scripts/setup.sh installs it) or skipping with a "needs <capability>:"
     reason. (Python tests that pass without any assertion are failed by tests/suite_main.py.)

  scripts/check_skips.py build [--skips-only] [--left-out TEXT]...
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def gpu_count():
    """GPUs the NVIDIA driver lists (0 without a driver or a device)."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def have_ucx():
    return subprocess.run(["pkg-config", "--exists", "ucx"]).returncode == 0 \
        if shutil.which("pkg-config") else False


def have_nvcc():
    return os.path.exists("/usr/local/cuda/bin/nvcc") or shutil.which("nvcc") is not None


def capabilities():
    """Each capability a skip may name, and whether this machine has it.
    PDSERVE_FAKE_CAPABILITIES="avx512=1,gpu=0,..." stands in for hardware the machine lacks, for
    tests/check_skips_test.py only."""
    flags = cpu_flags()
    gpus = gpu_count()
    caps = {
        "avx512": {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags,
        "avx512_vnni": {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"} <= flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": {"amx_bf16", "amx_tile"} <= flags,
        "gpu": gpus > 0,
        "no-gpu": gpus == 0,
        "openssl": shutil.which("openssl") is not None,
        "ucx": have_ucx(),
        "nvcc": have_nvcc(),
    }
    for item in filter(None, os.environ.get("PDSERVE_FAKE_CAPABILITIES", "").split(",")):
        name, value = item.split("=")
        caps[name] = value == "1"
    return caps


def read_skips(build):
    """(suite, test, message) of every recorded skip, once each."""
    seen = []
    for path in sorted(glob.glob(os.path.join(build, "skips", "*.tsv"))):
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 3 and tuple(parts) not in seen:
                    seen.append(tuple(parts))
    return seen


def ctest_names(build):
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True,
                         text=True, check=True)
    return {t["name"] for t in json.loads(out.stdout)["tests"]}


def cmake_cache(build):
    values = {}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if "=" in line and ":" in line.split("=", 1)[0] and not line.startswith(("#", "//")):
                    key, value = line.rstrip("\n").split("=", 1)
                    values[key.split(":", 1)[0]] = value
    except OSError:
        pass
    return values


# Suites a machine with the capability must build, and the CMake option that can leave them out.
EXPECTED_SUITES = [
    ("ucx", "PDSERVE_UCX", ["ucx_transport_test", "ucx_end_to_end"]),
    ("nvcc", "PDSERVE_CUDA", ["kernels_cuda_test", "device_model_runner_gpu_test"]),
]


# The sources scanned for tests that never run or check nothing (tests/check_skips_test.py points
# it at a fixture tree).
ROOT = os.environ.get("PDSERVE_CHECK_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ["common", "kernels", "router", "openai_api", "prefill_service", "decode_service", "planner",
               "cli", "bench", "tests"]


def sources(suffixes):
    for top in SOURCE_DIRS:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(suffixes):
                    yield os.path.join(d, f)


def disabled_tests():
    """(file, Suite.DISABLED_Name) of every GoogleTest test declared disabled."""
    import re
    out = []
    decl = re.compile(r"\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(DISABLED_\w+)\s*\)")
    for path in sources(("_test.cc",)):
        with open(path, errors="replace") as f:
            for suite, name in decl.findall(f.read()):
                out.append((os.path.relpath(path, ROOT), f"{suite}.{name}"))
    return out


def runs_disabled(build, test):
    """Whether a ctest entry runs `test` (Suite.DISABLED_Name) with --gtest_also_run_disabled_tests."""
    import fnmatch
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True, text=True, check=True)
    for t in json.loads(out.stdout)["tests"]:
        command = " ".join(t.get("command", []))
        if "--gtest_also_run_disabled_tests" not in command:
            continue
        for part in command.split():
            for token in part.replace('"', " ").replace("'", " ").split():
                if token.startswith("--gtest_filter="):
                    patterns = token[len("--gtest_filter="):].split("-")[0].split(":")
                    if any(fnmatch.fnmatch(test, p) for p in patterns):
                        return True
    return False


def tool_conditionals():
    """file:line of each `if ... shutil.which(` in the Python tests: a part of a test left out
    when a tool is missing, silently."""
    import re
    out = []
    pattern = re.compile(r"^\s*(el)?if\b.*shutil\.which\(")
    for path in sources((".py",)):
        if not os.path.relpath(path, ROOT).startswith("tests" + os.sep):
            continue
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                if pattern.search(line):
                    out.append(f"{os.path.relpath(path, ROOT)}:{number}")
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--skips-only", action="store_true",
                        help="check the skip records only (a build that leaves suites out on purpose)")
    parser.add_argument("--left-out", action="append", default=[])
    args = parser.parse_args()
    require_all = os.environ.get("PDSERVE_REQUIRE_ALL") == "1"
    caps = capabilities()
    errors, notes = [], []

    skips = read_skips(args.build)
    print(f"check_skips: {len(skips)} skipped test(s) in {args.build}; this machine has: "
          + ", ".join(sorted(c for c, has in caps.items() if has)))
    expected = {}  # (capability, suite, reason) -> tests: one line each.
    for suite, test, message in skips:
        cap = message.split(":", 1)[0][len("needs "):] if message.startswith("needs ") else None
        if cap not in caps or cap == "nvcc":
            errors.append(f"{suite} {test}: skipped without naming a capability it needs "
                          f"(\"needs <{'|'.join(caps)}>: ...\"): {message}")
        elif caps[cap]:
            errors.append(f"{suite} {test}: skipped on a machine that has {cap}: {message}")
        else:
            expected.setdefault((cap, suite, message.split(":", 1)[1].strip()), []).append(test)
    for (cap, suite, reason), tests in expected.items():
        print(f"  skipped (no {cap} here): {suite}, {len(tests)} test(s) ({reason}): {', '.join(tests)}")

    if not args.skips_only:
        names = ctest_names(args.build)
        cache = cmake_cache(args.build)
        for what, option, suites in EXPECTED_SUITES:
            if not caps[what]:
                continue
            missing = [s for s in suites if s not in names]
            if not missing:
                continue
            if cache.get(option, "").upper() == "OFF":
                line = f"{', '.join(missing)} not built: {what} is here but {option}=OFF"
                (errors if require_all else notes).append(line)
            else:
                errors.append(f"{', '.join(missing)} not built although {what} is here")
    for line in args.left_out:
        (errors if require_all else notes).append(f"left out: {line}")
    if not args.skips_only:
        for path, test in disabled_tests():
            if not runs_disabled(args.build, test):
                errors.append(f"{test} ({path}) is DISABLED_ and no ctest entry runs it "
                              "(--gtest_also_run_disabled_tests --gtest_filter=...)")
        for where in tool_conditionals():
            errors.append(f"{where}: part of a test is left out when a tool is missing (if shutil.which): "
                          "require the tool (scripts/setup.sh) or skip with 'needs <capability>:'")

    for line in notes:
        print(f"  NOTE {line}")
    for line in errors:
        print(f"  FAIL {line}")
    if errors:
        print(f"check_skips: {len(errors)} problem(s)" +
              (" (PDSERVE_REQUIRE_ALL=1: nothing may be left out)" if require_all else ""))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
