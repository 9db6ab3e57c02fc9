// The test main's hang watchdog (gtest_main.cc) on a test that outlives it:
// ctest runs this with PF_TEST_HANG_SECONDS=1 and passes it only when the
// watchdog named the test (tests/CMakeLists.txt, hang_watchdog_selftest).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

TEST(HangWatchdogSelfTest, OutlivesTheLimit) {
  std::this_thread::sleep_for(std::chrono::seconds(30));
}
