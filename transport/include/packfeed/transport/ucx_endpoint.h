#ifndef PACKFEED_TRANSPORT_UCX_ENDPOINT_H_
#define PACKFEED_TRANSPORT_UCX_ENDPOINT_H_

// RAII owners of a UCP endpoint and of a peer's unpacked remote key.

#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/transport/ucx_context.h"

namespace packfeed::transport {

// An endpoint to a peer worker in peer error mode: when the peer dies or
// becomes unreachable UCX calls `on_error(arg, ep, status)` from inside
// progress. Move-only. REQUIRES: the worker outlives the endpoint; all calls
// on the worker's thread.
class UcpEndpoint {
 public:
  static absl::StatusOr<UcpEndpoint> Connect(UcpWorker& worker, absl::string_view peer_address,
                                             ucp_err_handler_cb_t on_error, void* arg);
  UcpEndpoint(UcpEndpoint&& other) noexcept;
  UcpEndpoint& operator=(UcpEndpoint&& other) noexcept;
  UcpEndpoint(const UcpEndpoint&) = delete;
  UcpEndpoint& operator=(const UcpEndpoint&) = delete;
  ~UcpEndpoint();  // Force-closes; logs nothing, never fails.

  ucp_ep_h get() const { return endpoint_; }
  bool open() const { return endpoint_ != nullptr; }

  // Starts sending `bytes` as one eager active message `id` (never a
  // rendezvous the peer would have to fetch). The bytes must stay valid until
  // the returned request completes (UCX 1.13 has no COPY_HEADER).
  ucs_status_ptr_t SendEager(unsigned id, absl::string_view bytes) const;
  // The same with a header and data gathered from `pieces`; the header, the
  // pieces and the vector itself must stay valid until the request completes.
  ucs_status_ptr_t SendEager(unsigned id, absl::string_view header,
                             const std::vector<ucp_dt_iov_t>& pieces) const;
  // Starts a flush: completes when every operation posted before it has
  // completed at the peer.
  ucs_status_ptr_t Flush() const;
  // Starts a one-sided read of `bytes` at the peer's `remote_address`
  // (inside memory `rkey` covers) into `local`, which must stay valid until
  // the request completes.
  ucs_status_ptr_t Get(void* local, size_t bytes, uint64_t remote_address, ucp_rkey_h rkey) const;
  // Starts a one-sided write of `bytes` from `local` to the peer's
  // `remote_address` that never completes inside the call, so that UCX can
  // be asked how it carries it: `description` is ucp_request_query's text
  // (see put_protocol.h). `local` must stay valid until the request completes.
  struct DescribedPut {
    ucs_status_ptr_t request = nullptr;
    std::string description;
  };
  DescribedPut PutDescribed(const void* local, size_t bytes, uint64_t remote_address,
                            ucp_rkey_h rkey) const;

  // Closes the endpoint: flushes outstanding operations first unless
  // `force` (use force once the peer has failed). Idempotent.
  absl::Status Close(bool force);

  // The lanes UCX chose, as ucp_ep_print_info prints them ("rma(sysv/memory
  // posix/memory) am(sysv/memory) ..."), for logs and for checks that the
  // same-node data path is shared memory and not TCP.
  std::string TransportSummary() const;

 private:
  UcpEndpoint(UcpWorker* worker, ucp_ep_h endpoint) : worker_(worker), endpoint_(endpoint) {}
  UcpWorker* worker_ = nullptr;
  ucp_ep_h endpoint_ = nullptr;
};

// A peer's memory key unpacked for one endpoint. Move-only. REQUIRES: destroyed
// before its endpoint is closed.
class RemoteKey {
 public:
  static absl::StatusOr<RemoteKey> Unpack(const UcpEndpoint& endpoint, absl::string_view packed);
  RemoteKey() = default;
  RemoteKey(RemoteKey&& other) noexcept;
  RemoteKey& operator=(RemoteKey&& other) noexcept;
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;
  ~RemoteKey() { Reset(); }

  ucp_rkey_h get() const { return rkey_; }
  void Reset();

  // A local pointer to the peer's `remote_address` when the memory is shared
  // with this process (same-node shared memory); Unimplemented otherwise.
  absl::StatusOr<void*> LocalPointer(uint64_t remote_address) const;

 private:
  explicit RemoteKey(ucp_rkey_h rkey) : rkey_(rkey) {}
  ucp_rkey_h rkey_ = nullptr;
};

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_UCX_ENDPOINT_H_
