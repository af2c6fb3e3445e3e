// The main() of every GoogleTest binary (cmake/PdserveTest.cmake): GoogleTest's, plus a record of
// what was skipped, so a run cannot turn green while tests skip unnoticed.
//   - Each skipped test is appended, with the message GTEST_SKIP() gave, to
//     $PDSERVE_SKIP_DIR/<binary>.<pid>.tsv (one "binary<TAB>Suite.Test<TAB>message" line each);
//     scripts/check_skips.py reads them after ctest and fails on a skip this machine should not
//     have made (a message starts with "needs <capability>:", see that script).
//   - When tests were skipped and none passed or failed, the binary exits 77, which ctest counts
//     as a skipped test (SKIP_RETURN_CODE), not a passed one.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace {

constexpr int kAllSkipped = 77;

std::string Basename(const char* path) {
  const std::string p = path;
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// A message on one line: tabs and newlines would break the record's columns.
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

class SkipRecorder : public testing::EmptyTestEventListener {
 public:
  SkipRecorder(std::string binary, std::string path)
      : binary_(std::move(binary)), path_(std::move(path)) {}

  void OnTestEnd(const testing::TestInfo& info) override {
    const testing::TestResult& result = *info.result();
    if (!result.Skipped()) return;
    std::string message;
    for (int i = 0; i < result.total_part_count(); ++i) {
      const testing::TestPartResult& part = result.GetTestPartResult(i);
      if (part.skipped()) message = part.message();
    }
    std::ofstream out(path_, std::ios::app);
    out << binary_ << '\t' << info.test_suite_name() << '.' << info.name() << '\t'
        << OneLine(message) << '\n';
    if (!out) lost_ = true;
  }

  // A skip that could not be recorded: the run must not pass as if it had been.
  bool lost() const { return lost_; }

 private:
  std::string binary_, path_;
  bool lost_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  SkipRecorder* recorder = nullptr;
  if (const char* dir = std::getenv("PDSERVE_SKIP_DIR"); dir != nullptr && *dir != '\0') {
    const std::string binary = Basename(argv[0]);
    recorder = new SkipRecorder(
        binary, std::string(dir) + "/" + binary + "." + std::to_string(::getpid()) + ".tsv");
    testing::UnitTest::GetInstance()->listeners().Append(recorder);  // GoogleTest owns it.
  }
  const int rc = RUN_ALL_TESTS();
  if (recorder != nullptr && recorder->lost()) {
    std::fprintf(stderr, "gtest_main: could not record a skipped test under $PDSERVE_SKIP_DIR\n");
    return 1;
  }
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  if (rc == 0 && unit.skipped_test_count() > 0 && unit.successful_test_count() == 0) {
    return kAllSkipped;
  }
  return rc;
}
