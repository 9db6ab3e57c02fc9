#include "packfeed/transport/ucx_context.h"

#include <poll.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/ucx_status.h"

namespace packfeed::transport {
namespace {

struct UcpConfigDeleter {
  void operator()(ucp_config_t* config) const { ucp_config_release(config); }
};

absl::Status Modify(ucp_config_t* config, const char* name, const std::string& value) {
  return UcxStatus(ucp_config_modify(config, name, value.c_str()),
                   absl::StrCat("ucp_config_modify ", name, "=", value));
}

}  // namespace

absl::StatusOr<UcpContext> UcpContext::Create(const UcxOptions& options) {
  ucp_config_t* raw_config = nullptr;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_config_read(nullptr, nullptr, &raw_config), "ucp_config_read"));
  std::unique_ptr<ucp_config_t, UcpConfigDeleter> config(raw_config);
  // Shared-memory transports advertise peer-failure support only with these
  // set; endpoints in peer error mode would otherwise never use them.
  // (Only when shared memory may be used: UCX warns about the setting
  // otherwise.)
  const std::string& tls = options.transports;
  const bool shared_memory =
      tls.empty() || (absl::StartsWith(tls, "^")  // a list of those not to use
                          ? !(absl::StrContains(tls, "posix") && absl::StrContains(tls, "sysv"))
                          : absl::StrContains(tls, "sm") || absl::StrContains(tls, "mm") ||
                                absl::StrContains(tls, "posix") || absl::StrContains(tls, "sysv") ||
                                absl::StrContains(tls, "all"));
  if (shared_memory) {
    PF_RETURN_IF_ERROR(Modify(config.get(), "MM_ERROR_HANDLING", "y"));
  }
  PF_RETURN_IF_ERROR(Modify(config.get(), "KEEPALIVE_INTERVAL", options.keepalive_interval));
  if (!options.transports.empty()) {
    PF_RETURN_IF_ERROR(Modify(config.get(), "TLS", options.transports));
  }

  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucp_context_h context = nullptr;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_init(&params, config.get(), &context), "ucp_init"));
  std::unique_ptr<ucp_context, UcpContextDeleter> owned(context);

  ucp_context_attr_t attr = {};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_context_query(context, &attr), "ucp_context_query"));
  // memory_types is a bit mask: test the CUDA bit, not the enum value (the
  // enum value of CUDA is the HOST bit).
  const bool cuda = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  return UcpContext(owned.release(), cuda);
}

std::string UcpContext::LibraryVersion() { return ucp_get_version_string(); }

absl::StatusOr<UcpWorker> UcpWorker::Create(const UcpContext& context) {
  ucp_worker_params_t params = {};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  PF_RETURN_IF_ERROR(
      UcxStatus(ucp_worker_create(context.get(), &params, &worker), "ucp_worker_create"));
  std::unique_ptr<ucp_worker, UcpWorkerDeleter> owned(worker);

  ucp_address_t* address = nullptr;
  size_t length = 0;
  PF_RETURN_IF_ERROR(
      UcxStatus(ucp_worker_get_address(worker, &address, &length), "ucp_worker_get_address"));
  std::string address_bytes(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker, address);

  int event_fd = -1;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_worker_get_efd(worker, &event_fd), "ucp_worker_get_efd"));
  return UcpWorker(owned.release(), std::move(address_bytes), event_fd);
}

absl::Status UcpWorker::SetMessageHandler(unsigned id, ucp_am_recv_callback_t callback, void* arg) {
  ucp_am_handler_param_t handler = {};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = id;
  handler.cb = callback;
  handler.arg = arg;
  return UcxStatus(ucp_worker_set_am_recv_handler(worker_.get(), &handler),
                   "ucp_worker_set_am_recv_handler");
}

void UcpWorker::ProgressOrWait(absl::Duration timeout) {
  while (Progress()) {
  }
  // Arm reports BUSY when events arrived since the last progress: go round
  // again instead of sleeping on them.
  if (ucp_worker_arm(worker_.get()) == UCS_ERR_BUSY) return;
  pollfd fd = {event_fd_, POLLIN, 0};
  const int64_t millis = absl::ToInt64Milliseconds(timeout);
  while (poll(&fd, 1, static_cast<int>(millis)) < 0 && errno == EINTR) {
  }
}

absl::Status UcpWorker::Wait(ucs_status_ptr_t request, absl::string_view call) {
  return Wait(request, call, absl::InfiniteFuture(), [] {});
}

absl::Status UcpWorker::Wait(ucs_status_ptr_t request, absl::string_view call, absl::Time deadline,
                             absl::FunctionRef<void()> on_deadline) {
  if (request == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(request)) return UcxStatus(UCS_PTR_STATUS(request), call);
  ucs_status_t status;
  bool deadline_passed = false;
  int rounds = 0;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    ucp_worker_progress(worker_.get());
    // Reading the clock costs more than a progress round: look every 1024.
    if (!deadline_passed && ++rounds % 1024 == 0 && absl::Now() > deadline) {
      deadline_passed = true;
      on_deadline();
    }
  }
  ucp_request_free(request);
  return UcxStatus(status, call);
}

}  // namespace packfeed::transport
