#ifndef PACKFEED_CLIENT_SRC_WATCH_STREAM_H_
#define PACKFEED_CLIENT_SRC_WATCH_STREAM_H_

// The Control.Watch call an attached rank holds open: while this process
// lives and answers the daemon's pings, the daemon knows the rank is there.
// Destroying it cancels the call and waits for gRPC to be done with it.

#include "absl/synchronization/notification.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"
#include "packfeed/v1/service.grpc.pb.h"

namespace packfeed::client {

class WatchStream final : public grpc::ClientReadReactor<v1::WatchEvent> {
 public:
  WatchStream(v1::Control::Stub& stub, v1::WatchRequest request) : request_(std::move(request)) {
    stub.async()->Watch(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  ~WatchStream() override {
    context_.TryCancel();
    done_.WaitForNotification();
  }
  WatchStream(const WatchStream&) = delete;
  WatchStream& operator=(const WatchStream&) = delete;

  void OnReadDone(bool ok) override {
    if (ok) StartRead(&event_);  // nothing is sent on it yet
  }
  void OnDone(const grpc::Status& /*status*/) override { done_.Notify(); }

 private:
  grpc::ClientContext context_;
  v1::WatchRequest request_;
  v1::WatchEvent event_;
  absl::Notification done_;
};

}  // namespace packfeed::client

#endif  // PACKFEED_CLIENT_SRC_WATCH_STREAM_H_
