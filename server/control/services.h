#ifndef PACKFEED_SERVER_CONTROL_SERVICES_H_
#define PACKFEED_SERVER_CONTROL_SERVICES_H_

// The gRPC services of a Daemon (private to server/). The Daemon makes
// them and they call it back, so it is only declared here: daemon.h does
// not come back through this header.

#include <memory>
#include <string>

#include "packfeed/v1/service.grpc.pb.h"

namespace packfeed::server {

class Daemon;

std::unique_ptr<v1::Control::CallbackService> MakeControlService(Daemon& daemon);
std::unique_ptr<v1::Ingest::CallbackService> MakeIngestService(Daemon& daemon);
// `required_token` non-empty: every call must carry it (the TCP listener).
std::unique_ptr<v1::Admin::CallbackService> MakeAdminService(Daemon& daemon,
                                                             std::string required_token = "");

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_SERVICES_H_
