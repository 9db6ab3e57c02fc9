#include "payload_pattern.h"

#include <algorithm>
#include <cstring>

namespace packfeed::testing {
namespace {

uint64_t Word(uint64_t seq, uint32_t field, uint64_t index) {
  return (seq << 40) + (static_cast<uint64_t>(field) << 32) + index;
}

}  // namespace

void FillPattern(uint8_t* data, size_t bytes, uint64_t seq, uint32_t field) {
  const size_t words = bytes / 8;
  auto* out = reinterpret_cast<uint64_t*>(data);
  for (size_t i = 0; i < words; ++i) {
    const uint64_t word = Word(seq, field, i);
    std::memcpy(out + i, &word, 8);
  }
  const uint64_t tail = Word(seq, field, words);
  std::memcpy(data + words * 8, &tail, bytes % 8);
}

std::optional<size_t> FindPatternMismatch(const uint8_t* data, size_t bytes, uint64_t seq,
                                          uint32_t field) {
  const size_t words = bytes / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t word;
    std::memcpy(&word, data + i * 8, 8);
    if (word != Word(seq, field, i)) return i * 8;
  }
  const uint64_t tail = Word(seq, field, words);
  if (std::memcmp(data + words * 8, &tail, bytes % 8) != 0) return words * 8;
  return std::nullopt;
}

std::vector<transport::FieldSpec> TestFields(uint64_t seq, uint64_t max_payload_bytes) {
  using transport::ElementType;
  const uint64_t sizes[] = {1, 7, 4097, 64 << 10, (1 << 20) + 3, (16 << 20) - 1, max_payload_bytes};
  std::vector<transport::FieldSpec> fields;
  fields.push_back({"payload",
                    ElementType::kUInt8,
                    {static_cast<int64_t>(std::min(sizes[seq % 7], max_payload_bytes))}});
  if (seq % 2 == 1) {
    fields.push_back({"tokens", ElementType::kInt64, {1, static_cast<int64_t>(seq % 1000 + 1)}});
  }
  if (seq % 3 == 2) {
    fields.push_back({"cu_seqlens", ElementType::kInt32, {static_cast<int64_t>(seq % 5 + 2)}});
  }
  return fields;
}

}  // namespace packfeed::testing
