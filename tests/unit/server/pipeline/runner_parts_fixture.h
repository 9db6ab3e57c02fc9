// The fixture of the runner's parts' tests (held_steps_test.cc,
// side_row_window_test.cc): a real job over a generated dataset and the
// node's real Storage. The owner's thread is the test's: it runs what the
// parts post (a plan, a read) when it calls RunUntil.
#ifndef PACKFEED_TESTS_UNIT_SERVER_PIPELINE_RUNNER_PARTS_FIXTURE_H_
#define PACKFEED_TESTS_UNIT_SERVER_PIPELINE_RUNNER_PARTS_FIXTURE_H_

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/config/daemon_config.h"
#include "server/pipeline/held_steps.h"
#include "server/pipeline/job.h"
#include "server/storage/storage.h"
#include "test_job.h"
#include "test_paths.h"
#include "tests/unit/server/pipeline/job_of_config.h"

namespace packfeed::server {

class RunnerPartsTest : public ::testing::Test {
 protected:
  // A job of 4 DP ranks over 400 generated documents of 20-200 tokens;
  // with `side_field`, an int16 [2, 2] side field "experts" beside them.
  void MakeJob(bool side_field = false) {
    const std::string prefix = temp_.Prefix("data");
    ASSERT_TRUE(WriteTestJobData(prefix, side_field).ok());
    absl::StatusOr<v1::DaemonConfig> config = ParseDaemonConfig(
        "jobs { name: \"j\" " + TestJobBody(prefix, /*dp=*/4, /*tp=*/1, side_field) + " }", "test");
    ASSERT_TRUE(config.ok()) << config.status();
    const DatasetOpener open = [this](const std::string& p) { return storage_.Open(p); };
    absl::StatusOr<std::unique_ptr<Job>> job = JobOfConfig(config->jobs(0), open, nullptr);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
  }

  // What a part posts to its owner's thread: queued for RunUntil.
  HeldSteps::Post Poster() {
    return [this](std::function<void()> task) {
      absl::MutexLock lock(&mutex_);
      if (!stopped_) tasks_.push_back(std::move(task));
    };
  }
  // As a stopped runner: what comes back from now on is dropped. Call
  // before destroying the parts.
  void StopPosting() {
    absl::MutexLock lock(&mutex_);
    stopped_ = true;
  }

  // Runs what was posted, on this thread, until `done` (false after
  // `limit`).
  bool RunUntil(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + limit;
    while (!done()) {
      std::deque<std::function<void()>> tasks;
      {
        absl::MutexLock lock(&mutex_);
        const absl::Condition posted(
            +[](std::deque<std::function<void()>>* queued) { return !queued->empty(); }, &tasks_);
        if (!mutex_.AwaitWithDeadline(posted, deadline)) return false;
        tasks.swap(tasks_);
      }
      for (auto& task : tasks) {
        task();
        ++ran_;
      }
    }
    return true;
  }
  // Whether anything was posted within `wait` (and ran).
  bool RunUntilFor(absl::Duration wait) {
    const int before = ran_;
    RunUntil([&] { return ran_ > before; }, wait);
    return ran_ > before;
  }

  testing::ScopedTempDir temp_;
  Storage storage_{StorageOptions{}};
  std::unique_ptr<Job> job_;
  int ran_ = 0;  // tasks RunUntil ran

 private:
  absl::Mutex mutex_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mutex_);
  bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace packfeed::server

#endif  // PACKFEED_TESTS_UNIT_SERVER_PIPELINE_RUNNER_PARTS_FIXTURE_H_
