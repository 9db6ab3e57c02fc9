#include "server/control/rank_watches.h"

#include <algorithm>

namespace packfeed::server {

// Shared by a reactor and the registry. The reactor lives until Finish has
// been called (gRPC calls OnDone only after it), and Finish is called once,
// by whoever sets `finished`: so whoever sets it may call Finish after
// letting go of the lock.
struct RankWatches::State {
  absl::Mutex mutex;
  bool finished ABSL_GUARDED_BY(mutex) = false;
  grpc::ServerWriteReactor<v1::WatchEvent>* reactor = nullptr;
};

namespace {

class Watch final : public grpc::ServerWriteReactor<v1::WatchEvent> {
 public:
  Watch(std::shared_ptr<RankWatches::State> state, std::function<void()> gone)
      : state_(std::move(state)), gone_(std::move(gone)) {
    state_->reactor = this;
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&state_->mutex);
      if (state_->finished) return;  // ended by FinishAll
      state_->finished = true;
    }
    Finish(grpc::Status::CANCELLED);
    gone_();
  }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<RankWatches::State> state_;
  std::function<void()> gone_;
};

}  // namespace

grpc::ServerWriteReactor<v1::WatchEvent>* RankWatches::Start(std::function<void()> gone) {
  auto state = std::make_shared<State>();
  auto* watch = new Watch(state, std::move(gone));
  bool closed;
  {
    absl::MutexLock lock(&mutex_);
    closed = finished_;
    if (!closed) {
      // Drop the entries of streams already done, so the list stays short.
      open_.erase(std::remove_if(open_.begin(), open_.end(),
                                 [](const std::weak_ptr<State>& s) { return s.expired(); }),
                  open_.end());
      open_.push_back(state);
    }
  }
  if (closed) {
    {
      absl::MutexLock lock(&state->mutex);
      state->finished = true;
    }
    watch->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping"));
  }
  return watch;
}

void RankWatches::FinishAll() {
  std::vector<std::shared_ptr<State>> open;
  {
    absl::MutexLock lock(&mutex_);
    finished_ = true;
    for (const std::weak_ptr<State>& weak : open_) {
      if (std::shared_ptr<State> state = weak.lock()) open.push_back(std::move(state));
    }
    open_.clear();
  }
  for (const std::shared_ptr<State>& state : open) {
    {
      absl::MutexLock lock(&state->mutex);
      if (state->finished) continue;
      state->finished = true;
    }
    state->reactor->Finish(grpc::Status::OK);
  }
}

}  // namespace packfeed::server
