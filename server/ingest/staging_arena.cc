#include "server/ingest/staging_arena.h"

#include <algorithm>
#include <iterator>

namespace packfeed::server {
namespace {

uint64_t Aligned(uint64_t bytes) {
  constexpr uint64_t kAlign = ExtentAllocator::kExtentAlignment;
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

ExtentAllocator::ExtentAllocator(uint64_t bytes) {
  const uint64_t usable = bytes / kExtentAlignment * kExtentAlignment;
  if (usable > 0) free_[0] = usable;
}

std::optional<uint64_t> ExtentAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  const uint64_t need = Aligned(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[offset + need] = rest;
    return offset;
  }
  return std::nullopt;
}

std::map<uint64_t, uint64_t>::const_iterator ExtentAllocator::FreeSpanHolding(
    uint64_t offset, uint64_t bytes) const {
  if (bytes == 0 || offset % kExtentAlignment != 0) return free_.end();
  const uint64_t need = Aligned(bytes);
  auto it = free_.upper_bound(offset);
  if (it == free_.begin()) return free_.end();
  --it;  // the free span starting at or before `offset`
  if (offset + need < offset || offset + need > it->first + it->second) return free_.end();
  return it;
}

bool ExtentAllocator::IsFree(uint64_t offset, uint64_t bytes) const {
  return FreeSpanHolding(offset, bytes) != free_.end();
}

bool ExtentAllocator::AllocateAt(uint64_t offset, uint64_t bytes) {
  const auto it = FreeSpanHolding(offset, bytes);
  if (it == free_.end()) return false;
  const uint64_t need = Aligned(bytes);
  const auto [start, length] = *it;
  free_.erase(it);
  if (offset > start) free_[start] = offset - start;
  if (start + length > offset + need) free_[offset + need] = start + length - (offset + need);
  return true;
}

void ExtentAllocator::Free(uint64_t offset, uint64_t bytes) {
  uint64_t start = offset;
  uint64_t length = Aligned(bytes);
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == start) {
      start = before->first;
      length += before->second;
      free_.erase(before);
    }
  }
  if (next != free_.end() && start + length == next->first) {
    length += next->second;
    free_.erase(next);
  }
  free_[start] = length;
}

uint64_t ExtentAllocator::free_bytes() const {
  uint64_t total = 0;
  for (const auto& [offset, length] : free_) total += length;
  return total;
}

ArenaSpan::ArenaSpan(std::shared_ptr<StagingArena> arena, uint64_t offset, uint64_t bytes)
    : arena(std::move(arena)), offset(offset), bytes(bytes) {}

ArenaSpan::~ArenaSpan() {
  registered.reset();
  arena->Free(offset, bytes);
}

char* ArenaSpan::data() const { return arena->data() + offset; }

StagingArena::StagingArena(uint64_t id, std::shared_ptr<transport::SharedRing> memory,
                           transport::PeerIdentity owner)
    : id_(id), memory_(std::move(memory)), owner_(owner), spans_(memory_->bytes()) {}

std::shared_ptr<ArenaSpan> StagingArena::Take(uint64_t bytes) {
  std::optional<uint64_t> offset;
  {
    absl::MutexLock lock(&mutex_);
    offset = spans_.Allocate(bytes);
  }
  if (!offset.has_value()) return nullptr;
  return std::make_shared<ArenaSpan>(shared_from_this(), *offset, bytes);
}

std::shared_ptr<ArenaSpan> StagingArena::TakeAt(uint64_t offset, uint64_t bytes) {
  {
    absl::MutexLock lock(&mutex_);
    if (!spans_.AllocateAt(offset, bytes)) return nullptr;
  }
  return std::make_shared<ArenaSpan>(shared_from_this(), offset, bytes);
}

bool StagingArena::IsFree(uint64_t offset, uint64_t bytes) const {
  absl::MutexLock lock(&mutex_);
  return spans_.IsFree(offset, bytes);
}

std::vector<std::pair<uint64_t, uint64_t>> StagingArena::FreeSpans(size_t at_most) const {
  absl::MutexLock lock(&mutex_);
  const std::map<uint64_t, uint64_t>& free = spans_.free_spans();
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  spans.reserve(std::min(at_most, free.size()));
  for (auto span = free.begin(); span != free.end() && spans.size() < at_most; ++span) {
    spans.push_back(*span);
  }
  return spans;
}

void StagingArena::Free(uint64_t offset, uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  spans_.Free(offset, bytes);
}

}  // namespace packfeed::server
