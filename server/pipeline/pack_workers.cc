#include "server/pipeline/pack_workers.h"

#include <sched.h>

#include <algorithm>

namespace packfeed::server {

PackWorkers::PackWorkers(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { Help(); });
}

PackWorkers::~PackWorkers() {
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
  }
  for (std::thread& helper : helpers_) helper.join();
}

void PackWorkers::Run(int parts, absl::FunctionRef<void(int)> work) {
  if (helpers_.empty() || parts <= 1) {
    for (int i = 0; i < parts; ++i) work(i);
    return;
  }
  absl::MutexLock lock(&mutex_);
  work_ = &work;
  parts_ = parts;
  next_ = 0;
  done_ = 0;
  Drain();
  mutex_.Await(absl::Condition(
      +[](PackWorkers* self) ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->done_ == self->parts_; },
      this));
  work_ = nullptr;
}

void PackWorkers::Drain() {
  while (work_ != nullptr && next_ < parts_) {
    const int part = next_++;
    const absl::FunctionRef<void(int)>& work = *work_;
    mutex_.Unlock();
    work(part);
    mutex_.Lock();
    ++done_;
  }
}

void PackWorkers::Help() {
  absl::MutexLock lock(&mutex_);
  while (true) {
    mutex_.Await(absl::Condition(
        +[](PackWorkers* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return self->stop_ || (self->work_ != nullptr && self->next_ < self->parts_);
        },
        this));
    if (stop_) return;
    Drain();
  }
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace packfeed::server
