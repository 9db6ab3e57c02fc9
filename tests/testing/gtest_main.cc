// main() of every GoogleTest binary: GoogleTest's own, with two additions.
//
// A run in which every selected test skipped exits 77, ctest's skip code
// (SKIP_RETURN_CODE in tests/CMakeLists.txt). A binary, or a single test run
// alone (pf_test's ALONE), that could not run here is then reported as
// skipped, never as passed; one that ran anything reports as before; one
// whose filter matched no test fails.
//
// A test that runs longer than PF_TEST_HANG_SECONDS (set by pf_test a little
// under ctest's timeout) is named on stderr and the binary exits 124, as
// timeout(1) does, without running destructors that could wait on the hung
// test. ctest's timeout alone kills a binary without saying which test hung.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

constexpr int kHungExit = 124;

// Watches one test at a time from a thread of its own.
class HangWatchdog : public testing::EmptyTestEventListener {
 public:
  explicit HangWatchdog(std::chrono::seconds limit) : limit_(limit) {
    thread_ = std::thread([this] { Watch(); });
  }
  ~HangWatchdog() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  void OnTestStart(const testing::TestInfo& test) override {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = std::string(test.test_suite_name()) + "." + test.name();
    ++started_;
    changed_.notify_all();
  }
  void OnTestEnd(const testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(mutex_);
    running_.clear();
    changed_.notify_all();
  }

 private:
  void Watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      if (running_.empty()) {
        changed_.wait(lock);
        continue;
      }
      const uint64_t test = started_;
      if (changed_.wait_for(lock, limit_,
                            [&] { return stopping_ || started_ != test || running_.empty(); })) {
        continue;
      }
      std::fprintf(stderr, "\n%s has run for %lld s: it hangs; exiting\n", running_.c_str(),
                   static_cast<long long>(limit_.count()));
      std::fflush(stderr);
      std::_Exit(kHungExit);
    }
  }

  const std::chrono::seconds limit_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string running_;  // the test running now, "" between tests
  uint64_t started_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleMock(&argc, argv);
  const char* limit = std::getenv("PF_TEST_HANG_SECONDS");
  if (limit != nullptr && std::atoll(limit) > 0) {
    // Owned by GoogleTest's listener list from here on.
    testing::UnitTest::GetInstance()->listeners().Append(
        new HangWatchdog(std::chrono::seconds(std::atoll(limit))));
  }
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
