#ifndef PACKFEED_TRANSPORT_MEMORY_REGION_H_
#define PACKFEED_TRANSPORT_MEMORY_REGION_H_

// Memory mapped into a UCP context so that peers can put into it.

#include <ucp/api/ucp.h>

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace packfeed::transport {

// Move-only. Unmapping needs the context. REQUIRES: the context outlives the
// region. Thread-compatible.
class MemoryRegion {
 public:
  // Host memory allocated by UCX itself. On one node this makes the region a
  // shared-memory segment whose remote key lets a peer's put be a single
  // one-sided copy (a malloc'd region is emulated over active messages at half
  // the speed; docs/TRANSPORT.md).
  static absl::StatusOr<MemoryRegion> Allocate(ucp_context_h context, size_t length);
  // Registers memory the caller owns (host, or CUDA device memory when
  // `memory_type` says so). Fails when UCX reports another memory type than
  // the one asked for, e.g. CUDA memory on a UCX built without CUDA.
  static absl::StatusOr<MemoryRegion> Register(ucp_context_h context, void* address, size_t length,
                                               ucs_memory_type_t memory_type);

  MemoryRegion(MemoryRegion&& other) noexcept;
  MemoryRegion& operator=(MemoryRegion&& other) noexcept;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  ~MemoryRegion();  // Logs a failed unmap; never fails.

  void* address() const { return address_; }
  size_t length() const { return length_; }
  ucs_memory_type_t memory_type() const { return memory_type_; }
  ucp_mem_h handle() const { return memory_; }

  // The packed remote key a peer unpacks to put into this region.
  absl::StatusOr<std::string> PackRemoteKey() const;

 private:
  MemoryRegion(ucp_context_h context, ucp_mem_h memory, void* address, size_t length,
               ucs_memory_type_t type)
      : context_(context),
        memory_(memory),
        address_(address),
        length_(length),
        memory_type_(type) {}
  void Unmap();

  ucp_context_h context_ = nullptr;
  ucp_mem_h memory_ = nullptr;
  void* address_ = nullptr;
  size_t length_ = 0;
  ucs_memory_type_t memory_type_ = UCS_MEMORY_TYPE_HOST;
};

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_MEMORY_REGION_H_
