#ifndef PACKFEED_TESTS_TESTING_PAYLOAD_PATTERN_H_
#define PACKFEED_TESTS_TESTING_PAYLOAD_PATTERN_H_

// Payloads whose every byte says where it belongs: 8-byte word i of field f of
// message seq holds (seq << 40) + (f << 32) + i, so a byte that is lost,
// misplaced, left over from an earlier message or torn is found.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "packfeed/transport/wire.h"

namespace packfeed::testing {

void FillPattern(uint8_t* data, size_t bytes, uint64_t seq, uint32_t field);
// The offset of the first wrong byte, or nullopt when all are right.
std::optional<size_t> FindPatternMismatch(const uint8_t* data, size_t bytes, uint64_t seq,
                                          uint32_t field);

// The fields of test message `seq`: 1 to 3 fields whose sizes cycle through
// 1 B, odd sizes, 64 KiB, 1 MiB + 3, 16 MiB - 1 and `max_payload_bytes` (the
// largest is at most this plus 16 KiB).
std::vector<transport::FieldSpec> TestFields(uint64_t seq, uint64_t max_payload_bytes);

}  // namespace packfeed::testing

#endif  // PACKFEED_TESTS_TESTING_PAYLOAD_PATTERN_H_
