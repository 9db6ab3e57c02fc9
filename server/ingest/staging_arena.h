#ifndef PACKFEED_SERVER_INGEST_STAGING_ARENA_H_
#define PACKFEED_SERVER_INGEST_STAGING_ARENA_H_

// A producer's staging memory, which the daemon serves ingested samples
// from (docs/INGEST.md, "Memory"): a memfd the producer shared once over
// SOCKET.rings and the daemon mapped. Each put takes one span of it,
// reserved by the daemon or placed by the producer within the free spans
// the daemon's last reply named; the producer writes its samples there
// (the only copy of their bytes) and the span stays the daemon's until the
// last sample in it is freed.
//
// The memfd is sparse: only spans written ever take memory, and a span
// freed is written again by a later put of the same producer (first fit,
// lowest address first), so what a producer's arena takes stays near the
// most its stream ever held.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "packfeed/transport/memory_region.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/ucx_context.h"
#include "server/ingest/ingest_stream.h"

namespace packfeed::server {

// Spans of [0, bytes): first fit, lowest address first, free neighbours
// merged. Every span starts at a multiple of kExtentAlignment. Pure logic;
// thread-compatible.
class ExtentAllocator {
 public:
  static constexpr uint64_t kExtentAlignment = 64;

  explicit ExtentAllocator(uint64_t bytes);
  // The offset of a free span of `bytes` (> 0), now taken; nullopt when no
  // free span is that long.
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Takes the span of `bytes` (> 0) at `offset` (aligned) when it is free
  // whole; false, taking nothing, otherwise.
  bool AllocateAt(uint64_t offset, uint64_t bytes);
  // Whether AllocateAt(offset, bytes) would take the span now.
  bool IsFree(uint64_t offset, uint64_t bytes) const;
  // Returns a span Allocate gave (the same `bytes`).
  void Free(uint64_t offset, uint64_t bytes);
  uint64_t free_bytes() const;
  // offset -> length of every free span, lowest offset first.
  const std::map<uint64_t, uint64_t>& free_spans() const { return free_; }

 private:
  // The free span that holds [offset, offset + bytes) whole, or end().
  std::map<uint64_t, uint64_t>::const_iterator FreeSpanHolding(uint64_t offset,
                                                               uint64_t bytes) const;

  std::map<uint64_t, uint64_t> free_;  // offset -> length, disjoint, not touching
};

class StagingArena;

// One put's span of an arena; returned to it when destroyed. With peer
// daemons, registered with UCX so that they can get its samples.
struct ArenaSpan {
  ArenaSpan(std::shared_ptr<StagingArena> arena, uint64_t offset, uint64_t bytes);
  ~ArenaSpan();
  ArenaSpan(const ArenaSpan&) = delete;
  ArenaSpan& operator=(const ArenaSpan&) = delete;

  char* data() const;

  const std::shared_ptr<StagingArena> arena;
  const uint64_t offset;
  const uint64_t bytes;
  // With peers: the registration (unmapped before the span is freed), the
  // context it needs kept until then, and the region described for them.
  std::shared_ptr<const transport::UcpContext> context;
  std::optional<transport::MemoryRegion> registered;
  std::shared_ptr<const SampleRegion> region;
};

// Thread-safe: spans are freed on whichever thread drops a step's last
// sample.
class StagingArena : public std::enable_shared_from_this<StagingArena> {
 public:
  // `memory`: the producer's memfd, mapped; `owner`: the process that
  // shared it, the only one whose calls may use it.
  StagingArena(uint64_t id, std::shared_ptr<transport::SharedRing> memory,
               transport::PeerIdentity owner);

  uint64_t id() const { return id_; }
  const transport::PeerIdentity& owner() const { return owner_; }
  uint64_t bytes() const { return memory_->bytes(); }
  char* data() const { return reinterpret_cast<char*>(memory_->data()); }

  // A span of `bytes`; null while no free span is that long.
  std::shared_ptr<ArenaSpan> Take(uint64_t bytes);
  // The span of `bytes` at `offset`, placed there by the producer (a put in
  // one call); null unless it is free whole.
  std::shared_ptr<ArenaSpan> TakeAt(uint64_t offset, uint64_t bytes);
  bool IsFree(uint64_t offset, uint64_t bytes) const;
  // (offset, length) of the lowest `at_most` spans free now, lowest first
  // (copied under the arena's lock, so no more than a put's answer names).
  std::vector<std::pair<uint64_t, uint64_t>> FreeSpans(size_t at_most) const;

 private:
  friend struct ArenaSpan;
  void Free(uint64_t offset, uint64_t bytes);

  const uint64_t id_;
  const std::shared_ptr<transport::SharedRing> memory_;
  const transport::PeerIdentity owner_;
  mutable absl::Mutex mutex_;
  ExtentAllocator spans_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INGEST_STAGING_ARENA_H_
