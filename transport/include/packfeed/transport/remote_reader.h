#ifndef PACKFEED_TRANSPORT_REMOTE_READER_H_
#define PACKFEED_TRANSPORT_REMOTE_READER_H_

// One-sided reads of memory another process's worker registered
// (MemoryRegion::PackRemoteKey): what a daemon does to take a step another
// daemon forwards (docs/INGEST.md). Each origin's endpoint is connected
// once and kept; its last key stays unpacked while its reads come from the
// same region.
//
// REQUIRES: the worker outlives the reader; every call on the worker's
// thread.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "packfeed/transport/ucx_context.h"
#include "packfeed/transport/ucx_endpoint.h"

namespace packfeed::transport {

class RemoteReader {
 public:
  explicit RemoteReader(UcpWorker& worker) : worker_(worker) {}

  // `bytes` at `remote_offset` past the region's start, into `local`.
  struct Read {
    void* local = nullptr;
    uint64_t bytes = 0;
    uint64_t remote_offset = 0;
  };
  // Reads every one of `reads` from the region at `remote_address` of the
  // worker at `worker_address`, whose key is `packed_key`; returns once all
  // completed. All or nothing: Unavailable naming the cause when a get
  // cannot be posted, fails or is not done by `deadline`, or the origin's
  // endpoint fails; the connection's or the key's error when the origin
  // cannot be reached or its key unpacked. On an error the origin is
  // forgotten (connected afresh on the next call) and `local` holds no
  // defined bytes.
  absl::Status ReadAll(const std::string& worker_address, const std::string& packed_key,
                       uint64_t remote_address, absl::Span<const Read> reads, absl::Time deadline);

 private:
  struct Origin {
    bool failed = false;  // set by UCX's error callback
    std::optional<UcpEndpoint> endpoint;
    std::string packed_key;
    RemoteKey key;  // declared after the endpoint: freed first
  };
  absl::StatusOr<Origin*> OriginAt(const std::string& address, const std::string& packed_key);

  UcpWorker& worker_;
  std::map<std::string, std::unique_ptr<Origin>> origins_;
};

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_REMOTE_READER_H_
