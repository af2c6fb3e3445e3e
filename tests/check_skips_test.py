"""What a test run leaves out is recorded and judged (scripts/test.sh's last step):
  - a GoogleTest binary on common/testing/gtest_main.cc records each skip with its message and
    exits 77 (ctest: skipped) only when every test that ran skipped;
  - tests/suite_main.py does the same for a Python suite;
  - scripts/check_skips.py passes a skip only where the machine lacks what it names, and fails on
    a suite left unbuilt where the machine could build it. The machines it is judged on are stood
    in for with PDSERVE_FAKE_CAPABILITIES (this one has no AVX-512 or GPU to show the failures).

  /usr/bin/python3 tests/check_skips_test.py --fixture build/gtest_main_fixture
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "scripts", "check_skips.py")
SUITE_MAIN = os.path.join(ROOT, "tests", "suite_main.py")
FIXTURE = None


def records(skip_dir):
    lines = []
    for name in sorted(os.listdir(skip_dir)):
        with open(os.path.join(skip_dir, name)) as f:
            lines += [line.rstrip("\n").split("\t") for line in f]
    return lines


class Recorded(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="pdserve_skips_")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_fixture(self, **env):
        return subprocess.run([FIXTURE], capture_output=True, text=True,
                              env=dict(os.environ, PDSERVE_SKIP_DIR=self.dir, **env))

    def test_gtest_skip_is_recorded_and_passes_beside_passing_tests(self):
        out = self.run_fixture(PDSERVE_FIXTURE_SKIP="1")
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertEqual(records(self.dir),
                         [["gtest_main_fixture", "Fixture.Skips", "needs gpu: a fixture's skip over two lines"]])

    def test_gtest_all_skipped_exits_77(self):
        out = subprocess.run([FIXTURE, "--gtest_filter=Fixture.Skips"], capture_output=True, text=True,
                             env=dict(os.environ, PDSERVE_SKIP_DIR=self.dir, PDSERVE_FIXTURE_SKIP="1"))
        self.assertEqual(out.returncode, 77, out.stdout)

    def test_gtest_failure_beside_a_skip_is_a_failure(self):
        out = self.run_fixture(PDSERVE_FIXTURE_SKIP="1", PDSERVE_FIXTURE_FAIL="1")
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertEqual(len(records(self.dir)), 1)

    def test_gtest_nothing_skipped_nothing_recorded(self):
        out = self.run_fixture()
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertEqual(records(self.dir), [])

    def test_gtest_unwritable_record_fails_the_run(self):
        out = subprocess.run([FIXTURE], capture_output=True, text=True,
                             env=dict(os.environ, PDSERVE_SKIP_DIR=os.path.join(self.dir, "absent"),
                                      PDSERVE_FIXTURE_SKIP="1"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("could not record a skipped test", out.stderr)

    def run_suite(self, body):
        script = os.path.join(self.dir, "suite_fixture.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""\
                import sys, unittest
                class T(unittest.TestCase):
                """) + textwrap.indent(textwrap.dedent(body), "    ") + textwrap.dedent("""\
                if __name__ == "__main__":
                    unittest.main(argv=[sys.argv[0]], verbosity=2)
                """))
        skips = os.path.join(self.dir, "skips")
        os.makedirs(skips, exist_ok=True)
        out = subprocess.run([sys.executable, SUITE_MAIN, script], capture_output=True, text=True,
                             env=dict(os.environ, PDSERVE_SKIP_DIR=skips))
        return out, records(skips)

    def test_python_all_skipped_exits_77_and_is_recorded(self):
        out, recs = self.run_suite("""\
            def test_a(self):
                self.skipTest("needs ucx: built without it")
            """)
        self.assertEqual(out.returncode, 77, out.stderr)
        self.assertEqual(recs, [["suite_fixture", "T.test_a", "needs ucx: built without it"]])

    def test_python_skip_beside_a_pass_passes(self):
        out, recs = self.run_suite("""\
            def test_a(self):
                self.skipTest("needs gpu: none")
            def test_b(self):
                self.assertEqual(2, 2)
            """)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(len(recs), 1)

    def test_python_test_that_checks_nothing_fails(self):
        out, _ = self.run_suite("""\
            def test_a(self):
                for x in []:
                    self.assertEqual(x, 1)
            def test_b(self):
                self.assertEqual(2, 2)
            """)
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn("without checking anything", out.stderr)

    def test_python_failure_beside_a_skip_fails(self):
        out, _ = self.run_suite("""\
            def test_a(self):
                self.skipTest("needs gpu: none")
            def test_b(self):
                self.assertEqual(1, 2)
            """)
        self.assertEqual(out.returncode, 1, out.stderr)


class Judged(unittest.TestCase):
    """check_skips.py on a made-up build directory: skip records, a ctest list and a CMake cache."""

    def setUp(self):
        self.build = tempfile.mkdtemp(prefix="pdserve_check_")
        self.addCleanup(shutil.rmtree, self.build, True)
        os.makedirs(os.path.join(self.build, "skips"))
        self.ctest_list(["kernels_cpu_test", "ucx_transport_test", "ucx_end_to_end", "kernels_cuda_test",
                    "device_model_runner_gpu_test"])

    def ctest_list(self, names):
        with open(os.path.join(self.build, "CTestTestfile.cmake"), "w") as f:
            for name in names:
                f.write(f"add_test({name} /bin/true)\n")

    def skip(self, suite, test, message):
        with open(os.path.join(self.build, "skips", f"{suite}.1.tsv"), "a") as f:
            f.write(f"{suite}\t{test}\t{message}\n")

    def check(self, caps, *args, require_all=False, root=None):
        if root is None:  # An empty source tree: nothing DISABLED_, no tool conditionals.
            root = os.path.join(self.build, "empty_root")
            os.makedirs(root, exist_ok=True)
        env = dict(os.environ, PDSERVE_FAKE_CAPABILITIES=caps, PDSERVE_CHECK_ROOT=root)
        env.pop("PDSERVE_REQUIRE_ALL", None)
        if require_all:
            env["PDSERVE_REQUIRE_ALL"] = "1"
        return subprocess.run([sys.executable, CHECK, self.build, *args], capture_output=True,
                              text=True, env=env)

    NONE = "avx512=0,avx512_vnni=0,avx512_bf16=0,amx_bf16=0,gpu=0,no-gpu=1,openssl=1,ucx=1,nvcc=1"

    def test_a_skip_for_what_the_machine_lacks_passes_and_is_listed(self):
        self.skip("kernels_cpu_test", "LinearTest.Avx512", "needs avx512: this CPU has none")
        out = self.check(self.NONE)
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("skipped (no avx512 here): kernels_cpu_test, 1 test(s) (this CPU has none): LinearTest.Avx512",
                      out.stdout)

    def test_a_skip_for_what_the_machine_has_fails(self):
        self.skip("kernels_cpu_test", "LinearTest.Avx512", "needs avx512: this CPU has none")
        out = self.check(self.NONE.replace("avx512=0", "avx512=1"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("LinearTest.Avx512: skipped on a machine that has avx512", out.stdout)

    def test_a_gpu_skip_on_a_gpu_machine_fails(self):
        self.skip("kernels_cuda_test", "DeviceMmaTest.Layout", "needs gpu: no GPU")
        out = self.check(self.NONE.replace("gpu=0", "gpu=1").replace("no-gpu=1", "no-gpu=0"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("skipped on a machine that has gpu", out.stdout)

    def test_a_skip_naming_nothing_fails(self):
        self.skip("clients", "T.test_stop", "the random model's text has no usable stop string")
        out = self.check(self.NONE)
        self.assertEqual(out.returncode, 1)
        self.assertIn("skipped without naming a capability", out.stdout)

    def test_ucx_here_but_its_suites_not_built_fails(self):
        self.ctest_list(["kernels_cpu_test", "kernels_cuda_test", "device_model_runner_gpu_test"])
        out = self.check(self.NONE)
        self.assertEqual(out.returncode, 1)
        self.assertIn("ucx_transport_test, ucx_end_to_end not built although ucx is here", out.stdout)
        self.assertEqual(self.check(self.NONE.replace("ucx=1", "ucx=0")).returncode, 0)

    def test_nvcc_here_but_cuda_targets_not_built_fails(self):
        self.ctest_list(["kernels_cpu_test", "ucx_transport_test", "ucx_end_to_end"])
        out = self.check(self.NONE)
        self.assertEqual(out.returncode, 1)
        self.assertIn("kernels_cuda_test, device_model_runner_gpu_test not built although nvcc is here",
                      out.stdout)

    def test_an_option_that_leaves_suites_out_is_reported_and_fails_in_ci(self):
        self.ctest_list(["kernels_cpu_test", "ucx_transport_test", "ucx_end_to_end"])
        with open(os.path.join(self.build, "CMakeCache.txt"), "w") as f:
            f.write("PDSERVE_CUDA:STRING=OFF\n")
        out = self.check(self.NONE)
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("NOTE kernels_cuda_test, device_model_runner_gpu_test not built: nvcc is here "
                      "but PDSERVE_CUDA=OFF", out.stdout)
        self.assertEqual(self.check(self.NONE, require_all=True).returncode, 1)

    def test_a_disabled_test_no_entry_runs_and_a_tool_conditional_fail(self):
        root = os.path.join(self.build, "src")
        os.makedirs(os.path.join(root, "tests"))
        os.makedirs(os.path.join(root, "common"))
        with open(os.path.join(root, "common", "a_test.cc"), "w") as f:
            f.write("TEST(Suite, DISABLED_Heavy) {}\nTEST(Suite, Runs) {}\n")
        with open(os.path.join(root, "tests", "b.py"), "w") as f:
            f.write("import shutil\nif shutil.which('gnuplot'):\n    pass\n")
        out = self.check("", root=root)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("Suite.DISABLED_Heavy (common/a_test.cc) is DISABLED_ and no ctest entry runs it", out.stdout)
        self.assertIn("tests/b.py:2: part of a test is left out when a tool is missing", out.stdout)
        # An entry that runs it: no longer a problem.
        os.remove(os.path.join(root, "tests", "b.py"))
        with open(os.path.join(self.build, "CTestTestfile.cmake"), "a") as f:
            f.write("add_test(heavy /bin/true --gtest_also_run_disabled_tests --gtest_filter=Suite.DISABLED_*)\n")
        out = self.check("", root=root)
        self.assertEqual(out.returncode, 0, out.stdout)

    def test_left_out_is_reported_and_fails_in_ci(self):
        args = ["--left-out", "the fuzzers (PDSERVE_SKIP_FUZZ=1)"]
        out = self.check(self.NONE, *args)
        self.assertEqual(out.returncode, 0)
        self.assertIn("NOTE left out: the fuzzers (PDSERVE_SKIP_FUZZ=1)", out.stdout)
        out = self.check(self.NONE, *args, require_all=True)
        self.assertEqual(out.returncode, 1)
        self.assertIn("FAIL left out: the fuzzers", out.stdout)


class GpuState(unittest.TestCase):
    """scripts/gpu_state.sh, which scripts/gpu_check.sh starts from: "a GPU the driver cannot use"
    is a failure there, not the skip "no GPU" is. A fake nvidia-smi and fake device nodes stand
    in for GPUs and drivers this machine lacks."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="pdserve_gpu_state_")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def state(self, smi_output, smi_status, nodes):
        smi = os.path.join(self.dir, "nvidia-smi")
        with open(smi, "w") as f:
            f.write(f"#!/bin/sh\nprintf '%s' '{smi_output}'\nexit {smi_status}\n")
        os.chmod(smi, 0o755)
        for n in nodes:
            open(os.path.join(self.dir, n), "w").close()
        out = subprocess.run([os.path.join(ROOT, "scripts", "gpu_state.sh")], capture_output=True,
                             text=True, env=dict(os.environ, NVIDIA_SMI=smi,
                                                 PDSERVE_GPU_DEV_GLOB=os.path.join(self.dir, "nvidia[0-9]*")))
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.strip()

    def test_a_listed_gpu_is_usable(self):
        self.assertEqual(self.state("GPU 0: NVIDIA H200 (UUID: GPU-1)\n", 0, ["nvidia0"]), "usable")

    def test_a_device_node_the_driver_does_not_list_is_unusable(self):
        self.assertEqual(self.state("NVIDIA-SMI has failed because it could not reach the "
                                    "NVIDIA driver.\n", 9, ["nvidia0"]), "unusable")
        self.assertEqual(self.state("", 0, ["nvidia1"]), "unusable")

    def test_no_node_and_no_listing_is_none(self):
        self.assertEqual(self.state("No devices were found\n", 6, []), "none")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixture", required=True)
    args, rest = parser.parse_known_args()
    FIXTURE = os.path.abspath(args.fixture)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
