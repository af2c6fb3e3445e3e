"""Runs one Python test suite for ctest (tests/CMakeLists.txt): the suite's own __main__, with
unittest's runner swapped for one that records skipped tests, as the GoogleTest binaries' main
does (common/testing/gtest_main.cc):
  - each skipped test is appended, with its reason, to $PDSERVE_SKIP_DIR/<suite>.<pid>.tsv
    ("suite<TAB>Class.test<TAB>reason"); scripts/check_skips.py reads the records after ctest;
  - when tests were skipped and none passed or failed, the exit status is 77, which ctest counts
    as skipped (SKIP_RETURN_CODE), not passed;
  - each test's assert* calls are counted, and a test that passed having checked nothing (its
    loops all `continue`d, its condition never held) fails the suite: a test that cannot fail is
    a bug.

  /usr/bin/python3 tests/suite_main.py tests/e2e/test_tiers.py --pdserve build/pdserve
"""
import os
import runpy
import sys
import unittest

ALL_SKIPPED = 77


class RecordingResult(unittest.TextTestResult):
    """A TextTestResult that also writes each skip to the suite's record."""

    record_path = None  # Set by main() when PDSERVE_SKIP_DIR is.
    suite = ""
    last = None         # The result of the run, for main()'s exit status.

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        RecordingResult.last = self

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        if self.record_path:
            name = test.id().split(".", 1)[-1]  # Drop the "__main__." module part.
            line = " ".join(str(reason).split())
            with open(self.record_path, "a") as out:
                out.write(f"{self.suite}\t{name}\t{line}\n")

    def passed(self):
        return (self.testsRun - len(self.failures) - len(self.errors) - len(self.skipped)
                - len(self.expectedFailures) - len(self.unexpectedSuccesses))


class RecordingRunner(unittest.TextTestRunner):
    resultclass = RecordingResult


class CountingResult(RecordingResult):
    """Counts each test's assertions (unittest.TestCase's assert* methods and fail); a test that
    ends successfully with none is an error."""

    checks = 0

    def startTest(self, test):
        CountingResult.checks = 0
        super().startTest(test)

    def addSuccess(self, test):
        if CountingResult.checks == 0:
            try:
                raise AssertionError("the test passed without checking anything (no assertion ran)")
            except AssertionError:
                self.addFailure(test, sys.exc_info())
            return
        super().addSuccess(test)


def count_assertions():
    """Wraps every assert* method of unittest.TestCase to count its calls (nested calls, as
    assertEqual calling assertListEqual, count once or more: only zero matters)."""
    def counted(method):
        def wrapper(*args, **kwargs):
            CountingResult.checks += 1
            return method(*args, **kwargs)
        return wrapper
    for name in dir(unittest.TestCase):
        if name.startswith("assert") or name == "fail":
            setattr(unittest.TestCase, name, counted(getattr(unittest.TestCase, name)))


class CountingRunner(unittest.TextTestRunner):
    resultclass = CountingResult


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: suite_main.py SCRIPT [ARGS...]")
    script = os.path.abspath(sys.argv[1])
    RecordingResult.suite = os.path.splitext(os.path.basename(script))[0]
    skip_dir = os.environ.get("PDSERVE_SKIP_DIR")
    if skip_dir:
        RecordingResult.record_path = os.path.join(
            skip_dir, f"{RecordingResult.suite}.{os.getpid()}.tsv")
    plain_main = unittest.main

    def recording_main(*args, **kwargs):
        kwargs.setdefault("testRunner", CountingRunner)
        return plain_main(*args, **kwargs)

    count_assertions()
    unittest.main = recording_main
    sys.argv = [script] + sys.argv[2:]
    sys.path.insert(0, os.path.dirname(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    result = RecordingResult.last
    if result is None:
        print("suite_main.py: the suite ran no unittest.main()", file=sys.stderr)
        sys.exit(code or 1)
    if code == 0 and result.skipped and result.passed() == 0:
        sys.exit(ALL_SKIPPED)
    sys.exit(code)


if __name__ == "__main__":
    main()
