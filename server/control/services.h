#ifndef PACKFEED_SERVER_CONTROL_SERVICES_H_
#define PACKFEED_SERVER_CONTROL_SERVICES_H_

// The gRPC services of a Daemon (private to server/).

#include <memory>

#include "absl/status/status.h"
#include "packfeed/proto/grpc_status.h"
#include "packfeed/v1/service.grpc.pb.h"
#include "server/control/attach_check.h"
#include "server/control/daemon.h"

namespace packfeed::server {

std::unique_ptr<v1::Control::CallbackService> MakeControlService(Daemon& daemon);
std::unique_ptr<v1::Ingest::CallbackService> MakeIngestService(Daemon& daemon);
// `required_token` non-empty: every call must carry it (the TCP listener).
std::unique_ptr<v1::Admin::CallbackService> MakeAdminService(Daemon& daemon,
                                                             std::string required_token = "");

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_SERVICES_H_
