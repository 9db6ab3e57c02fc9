// main() of every GoogleTest binary: GoogleTest's own, except that a run in
// which every selected test skipped exits 77, ctest's skip code
// (SKIP_RETURN_CODE in tests/CMakeLists.txt). A binary, or a single test run
// alone (pf_test's ALONE), that could not run here is then reported as
// skipped, never as passed; one that ran anything reports as before; one
// whose filter matched no test fails.
#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  testing::InitGoogleMock(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  if (failed != 0) return failed;
  const testing::UnitTest& run = *testing::UnitTest::GetInstance();
  if (run.test_to_run_count() == 0 && run.disabled_test_count() == 0) {
    // A filter (ALONE's, a shard's) that matched nothing ran nothing.
    std::fprintf(stderr, "no test matched: nothing ran\n");
    return 1;
  }
  constexpr int kSkipped = 77;
  if (run.test_to_run_count() > 0 && run.skipped_test_count() == run.test_to_run_count()) {
    return kSkipped;
  }
  return 0;
}
