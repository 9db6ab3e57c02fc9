#ifndef PACKFEED_SCHEDULER_THD_PARTITION_H_
#define PACKFEED_SCHEDULER_THD_PARTITION_H_

// Zigzag (load-balanced) context-parallel split of a THD buffer, as
// TransformerEngine's thd_get_partitioned_indices defines it: each sequence
// of padded length L is cut into 2·c equal parts of L/(2c) tokens, and CP
// rank k's slice is part k then part 2c−1−k, sequence after sequence. The
// one definition of the split: the daemon's packer and every check use it.
// (Megatron and Transformer Engine call the parts chunks; here a chunk is a
// VPP model chunk only, docs/ARCHITECTURE.md's words.)

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace packfeed::scheduler {

// Positions [begin, end) within one sequence.
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The slice of a sequence of `padded_length` that CP rank `cp_rank` of a
// group of `cp_size` holds, as two ranges: part k, then part 2c−1−k. With
// cp_size 1 the first range is the whole sequence and the second is empty.
// InvalidArgument when cp_rank is outside [0, cp_size) or padded_length is
// not a multiple of 2·cp_size (cp_size > 1).
absl::StatusOr<std::array<TokenRange, 2>> ZigzagSlice(int64_t padded_length, int cp_size,
                                                      int cp_rank);

// Indices into the pre-split buffer that CP rank `cp_rank` of a group of
// `cp_size` holds, in order; cu_seqlens_padded[-1] / cp_size of them.
// InvalidArgument when cu_seqlens_padded does not start at 0, decreases, or
// has a sequence ZigzagSlice refuses.
absl::StatusOr<std::vector<int64_t>> ZigzagIndices(absl::Span<const int64_t> cu_seqlens_padded,
                                                   int cp_size, int cp_rank);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_THD_PARTITION_H_
