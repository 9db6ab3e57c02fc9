#ifndef PACKFEED_TESTS_UNIT_SERVER_PACK_READ_BACK_H_
#define PACKFEED_TESTS_UNIT_SERVER_PACK_READ_BACK_H_

// Tests' view of what WriteMicrobatch wrote: each field read back from a
// slot laid out as the daemon lays it out, by its wire name.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/pipeline/pack.h"

namespace packfeed::server {

// A field the stage does not receive is empty.
struct PackedMicrobatch {
  std::vector<int64_t> tokens;
  std::vector<int64_t> labels;
  std::vector<float> loss_mask;
  std::vector<int64_t> position_ids;
  std::vector<uint8_t> padding_mask;  // bool
  std::vector<int32_t> cu_seqlens;
  std::vector<int32_t> cu_seqlens_padded;
  int32_t max_seqlen = 0;
  std::optional<int32_t> local_cp_size;
  std::vector<int32_t> cp_group_ranks;
  struct Side {
    std::string name;
    transport::ElementType type = transport::ElementType::kUInt8;
    std::vector<int64_t> inner_shape;  // the layer axis cut to the slice
    std::vector<char> bytes;           // [T_loc, *inner_shape]
  };
  std::vector<Side> side;  // every field not named above, in slot order
};

// WriteMicrobatch into a slot of MicrobatchSpecs' layout, read back.
PackedMicrobatch ReadBack(const MicrobatchSource& source);

// SourceOfGroup, written and read back.
absl::StatusOr<PackedMicrobatch> PackMicrobatch(const scheduler::CpGroup& group,
                                                absl::Span<const absl::Span<const int64_t>> runs,
                                                int cp_rank, const dataset::SampleRules& rules,
                                                std::vector<SideRun> sides = {});

}  // namespace packfeed::server

#endif  // PACKFEED_TESTS_UNIT_SERVER_PACK_READ_BACK_H_
