#include "packfeed/transport/remote_reader.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace packfeed::transport {
namespace {

void OnOriginError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  spdlog::warn("an origin worker's endpoint failed: {}", ucs_status_string(status));
  *static_cast<bool*>(arg) = true;
}

}  // namespace

absl::StatusOr<RemoteReader::Origin*> RemoteReader::OriginAt(const std::string& address,
                                                             const std::string& packed_key) {
  auto known = origins_.find(address);
  if (known != origins_.end() && known->second->failed) {
    origins_.erase(known);
    known = origins_.end();
  }
  if (known == origins_.end()) {
    auto origin = std::make_unique<Origin>();
    PF_ASSIGN_OR_RETURN(UcpEndpoint endpoint,
                        UcpEndpoint::Connect(worker_, address, OnOriginError, &origin->failed));
    origin->endpoint.emplace(std::move(endpoint));
    known = origins_.emplace(address, std::move(origin)).first;
  }
  Origin& origin = *known->second;
  if (origin.key.get() == nullptr || origin.packed_key != packed_key) {
    origin.key.Reset();
    origin.packed_key.clear();
    PF_ASSIGN_OR_RETURN(origin.key, RemoteKey::Unpack(*origin.endpoint, packed_key));
    origin.packed_key = packed_key;
  }
  return &origin;
}

absl::Status RemoteReader::ReadAll(const std::string& worker_address, const std::string& packed_key,
                                   uint64_t remote_address, absl::Span<const Read> reads,
                                   absl::Time deadline) {
  absl::StatusOr<Origin*> found = OriginAt(worker_address, packed_key);
  if (!found.ok()) {
    origins_.erase(worker_address);
    return found.status();
  }
  Origin& origin = **found;
  std::vector<ucs_status_ptr_t> requests;
  absl::Status status;
  for (const Read& read : reads) {
    if (read.bytes == 0) continue;
    ucs_status_ptr_t request = origin.endpoint->Get(
        read.local, read.bytes, remote_address + read.remote_offset, origin.key.get());
    if (UCS_PTR_IS_ERR(request)) {
      status = absl::UnavailableError(
          absl::StrCat("ucp_get_nbx: ", ucs_status_string(UCS_PTR_STATUS(request))));
      break;
    }
    if (request != nullptr) requests.push_back(request);
  }
  // Every posted get is waited for, whatever failed: `local` must not be
  // written after this returns.
  for (ucs_status_ptr_t request : requests) {
    absl::Status done = worker_.Wait(request, "ucp_get_nbx", deadline,
                                     [&] { origin.endpoint->Close(/*force=*/true).IgnoreError(); });
    if (status.ok() && !done.ok()) status = done;
  }
  if (status.ok() && origin.failed) status = absl::UnavailableError("its endpoint failed");
  if (!status.ok()) {
    origins_.erase(worker_address);
    return absl::UnavailableError(status.message());
  }
  return absl::OkStatus();
}

}  // namespace packfeed::transport
