// A GoogleTest binary for tests/check_skips_test.py, which runs it to check gtest_main.cc's skip
// record and exit status: PDSERVE_FIXTURE_SKIP=1 makes Fixture.Skips skip,
// PDSERVE_FIXTURE_FAIL=1 makes Fixture.Fails fail; otherwise every test passes.
#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace {

bool Set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

TEST(Fixture, Passes) { EXPECT_EQ(1 + 1, 2); }

TEST(Fixture, Skips) {
  if (Set("PDSERVE_FIXTURE_SKIP")) GTEST_SKIP() << "needs gpu: a fixture's skip\nover two lines";
}

TEST(Fixture, Fails) { EXPECT_FALSE(Set("PDSERVE_FIXTURE_FAIL")) << "asked to fail"; }

}  // namespace
