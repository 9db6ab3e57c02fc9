#include "packfeed/scheduler/thd_partition.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packfeed {

absl::StatusOr<std::vector<int64_t>> ZigzagIndices(
    absl::Span<const int64_t> cu_seqlens_padded, int cp_size, int cp_rank) {
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zigzag: CP rank ", cp_rank, " outside a group of ", cp_size));
  }
  if (cu_seqlens_padded.empty() || cu_seqlens_padded.front() != 0) {
    return absl::InvalidArgumentError(
        "zigzag: cu_seqlens_padded must start at 0");
  }
  const int64_t divisor = cp_size > 1 ? 2 * int64_t{cp_size} : 1;
  for (size_t j = 0; j < cu_seqlens_padded.size(); ++j) {
    const int64_t value = cu_seqlens_padded[j];
    if ((j > 0 && value < cu_seqlens_padded[j - 1]) || value % divisor != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zigzag: cu_seqlens_padded[", j, "] = ", value,
          " must be non-decreasing and a multiple of 2·cp = ", divisor));
    }
  }
  std::vector<int64_t> indices;
  indices.reserve(static_cast<size_t>(cu_seqlens_padded.back() / cp_size));
  for (size_t j = 0; j + 1 < cu_seqlens_padded.size(); ++j) {
    const int64_t start = cu_seqlens_padded[j];
    const int64_t length = cu_seqlens_padded[j + 1] - start;
    if (cp_size == 1) {
      for (int64_t t = 0; t < length; ++t) indices.push_back(start + t);
      continue;
    }
    const int64_t chunk = length / (2 * cp_size);
    for (int64_t piece :
         {int64_t{cp_rank}, 2 * int64_t{cp_size} - 1 - cp_rank}) {
      for (int64_t t = 0; t < chunk; ++t) {
        indices.push_back(start + piece * chunk + t);
      }
    }
  }
  return indices;
}

}  // namespace packfeed
