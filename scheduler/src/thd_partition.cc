#include "packfeed/scheduler/thd_partition.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packfeed::scheduler {

absl::StatusOr<std::array<TokenRange, 2>> ZigzagSlice(int64_t padded_length, int cp_size,
                                                      int cp_rank) {
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("zigzag: CP rank ", cp_rank, " outside a group of ", cp_size));
  }
  if (cp_size == 1) return std::array<TokenRange, 2>{{{0, padded_length}, {0, 0}}};
  const int64_t pieces = 2 * int64_t{cp_size};
  if (padded_length < 0 || padded_length % pieces != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zigzag: padded length ", padded_length, " does not split into ", pieces, " parts (2·cp)"));
  }
  const int64_t part = padded_length / pieces;
  const int64_t mirror = pieces - 1 - cp_rank;
  return std::array<TokenRange, 2>{
      {{cp_rank * part, (cp_rank + 1) * part}, {mirror * part, (mirror + 1) * part}}};
}

absl::StatusOr<std::vector<int64_t>> ZigzagIndices(absl::Span<const int64_t> cu_seqlens_padded,
                                                   int cp_size, int cp_rank) {
  if (cu_seqlens_padded.empty() || cu_seqlens_padded.front() != 0) {
    return absl::InvalidArgumentError("zigzag: cu_seqlens_padded must start at 0");
  }
  std::vector<int64_t> indices;
  for (size_t j = 0; j + 1 < cu_seqlens_padded.size(); ++j) {
    const int64_t start = cu_seqlens_padded[j];
    const int64_t length = cu_seqlens_padded[j + 1] - start;
    if (length < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("zigzag: cu_seqlens_padded decreases at ", j + 1));
    }
    absl::StatusOr<std::array<TokenRange, 2>> ranges = ZigzagSlice(length, cp_size, cp_rank);
    if (!ranges.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cu_seqlens_padded[", j + 1,
                                                     "] = ", cu_seqlens_padded[j + 1], ": ",
                                                     ranges.status().message()));
    }
    for (const TokenRange& range : *ranges) {
      for (int64_t t = range.begin; t < range.end; ++t) indices.push_back(start + t);
    }
  }
  return indices;
}

}  // namespace packfeed::scheduler
