#include "packfeed/transport/ucx_endpoint.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "packfeed/common/status_macros.h"
#include "packfeed/transport/ucx_status.h"

namespace packfeed::transport {

absl::StatusOr<UcpEndpoint> UcpEndpoint::Connect(UcpWorker& worker, absl::string_view peer_address,
                                                 ucp_err_handler_cb_t on_error, void* arg) {
  ucp_ep_params_t params = {};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_error;
  params.err_handler.arg = arg;
  ucp_ep_h endpoint = nullptr;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_ep_create(worker.get(), &params, &endpoint), "ucp_ep_create"));
  return UcpEndpoint(&worker, endpoint);
}

UcpEndpoint::UcpEndpoint(UcpEndpoint&& other) noexcept
    : worker_(other.worker_), endpoint_(std::exchange(other.endpoint_, nullptr)) {}

UcpEndpoint& UcpEndpoint::operator=(UcpEndpoint&& other) noexcept {
  if (this != &other) {
    Close(/*force=*/true).IgnoreError();
    worker_ = other.worker_;
    endpoint_ = std::exchange(other.endpoint_, nullptr);
  }
  return *this;
}

UcpEndpoint::~UcpEndpoint() { Close(/*force=*/true).IgnoreError(); }

absl::Status UcpEndpoint::Close(bool force) {
  if (endpoint_ == nullptr) return absl::OkStatus();
  ucp_request_param_t params = {};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(std::exchange(endpoint_, nullptr), &params);
  return worker_->Wait(request, "ucp_ep_close_nbx");
}

ucs_status_ptr_t UcpEndpoint::SendEager(unsigned id, absl::string_view bytes) const {
  ucp_request_param_t params = {};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_AM_SEND_FLAG_EAGER;
  return ucp_am_send_nbx(endpoint_, id, nullptr, 0, bytes.data(), bytes.size(), &params);
}

ucs_status_ptr_t UcpEndpoint::SendEager(unsigned id, absl::string_view header,
                                        const std::vector<ucp_dt_iov_t>& pieces) const {
  ucp_request_param_t params = {};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
  params.flags = UCP_AM_SEND_FLAG_EAGER;
  params.datatype = ucp_dt_make_iov();
  return ucp_am_send_nbx(endpoint_, id, header.data(), header.size(), pieces.data(), pieces.size(),
                         &params);
}

ucs_status_ptr_t UcpEndpoint::Flush() const {
  ucp_request_param_t params = {};
  return ucp_ep_flush_nbx(endpoint_, &params);
}

ucs_status_ptr_t UcpEndpoint::Get(void* local, size_t bytes, uint64_t remote_address,
                                  ucp_rkey_h rkey) const {
  ucp_request_param_t params = {};
  return ucp_get_nbx(endpoint_, local, bytes, remote_address, rkey, &params);
}

UcpEndpoint::DescribedPut UcpEndpoint::PutDescribed(const void* local, size_t bytes,
                                                    uint64_t remote_address,
                                                    ucp_rkey_h rkey) const {
  ucp_request_param_t params = {};
  params.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  DescribedPut put;
  put.request = ucp_put_nbx(endpoint_, local, bytes, remote_address, rkey, &params);
  if (put.request == nullptr || UCS_PTR_IS_ERR(put.request)) return put;
  char text[512] = {};
  ucp_request_attr_t attr = {};
  attr.field_mask = UCP_REQUEST_ATTR_FIELD_INFO_STRING | UCP_REQUEST_ATTR_FIELD_INFO_STRING_SIZE;
  attr.debug_string = text;
  attr.debug_string_size = sizeof(text);
  if (ucp_request_query(put.request, &attr) == UCS_OK) put.description = text;
  return put;
}

std::string UcpEndpoint::TransportSummary() const {
  if (endpoint_ == nullptr) return "";
  char* buffer = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buffer, &size);
  if (stream == nullptr) return "";
  ucp_ep_print_info(endpoint_, stream);
  fclose(stream);
  std::string text(buffer, size);
  free(buffer);
  return text;
}

absl::StatusOr<RemoteKey> RemoteKey::Unpack(const UcpEndpoint& endpoint, absl::string_view packed) {
  ucp_rkey_h rkey = nullptr;
  PF_RETURN_IF_ERROR(
      UcxStatus(ucp_ep_rkey_unpack(endpoint.get(), packed.data(), &rkey), "ucp_ep_rkey_unpack"));
  return RemoteKey(rkey);
}

RemoteKey::RemoteKey(RemoteKey&& other) noexcept : rkey_(std::exchange(other.rkey_, nullptr)) {}

RemoteKey& RemoteKey::operator=(RemoteKey&& other) noexcept {
  if (this != &other) {
    Reset();
    rkey_ = std::exchange(other.rkey_, nullptr);
  }
  return *this;
}

void RemoteKey::Reset() {
  if (rkey_ != nullptr) ucp_rkey_destroy(std::exchange(rkey_, nullptr));
}

absl::StatusOr<void*> RemoteKey::LocalPointer(uint64_t remote_address) const {
  void* pointer = nullptr;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_rkey_ptr(rkey_, remote_address, &pointer), "ucp_rkey_ptr"));
  return pointer;
}

}  // namespace packfeed::transport
