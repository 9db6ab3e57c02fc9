#ifndef PACKFEED_DATASET_COMPACT_INDEX_H_
#define PACKFEED_DATASET_COMPACT_INDEX_H_

// What a parsed .idx must keep once the file's bytes are gone. A corpus of
// 10^8 sequences has a 2 GB index, but Megatron's writer makes most of it
// redundant: every pointer is the previous sequence's end, and with one
// sequence per document the document index is 0, 1, ..., S. Keeping only
// the lengths (and what is not redundant) cuts that to 0.4 GB.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "packfeed/dataset/index_format.h"

namespace packfeed::dataset {

// The entries of an index in as little memory as they allow: the lengths
// (aligned, so they can be lent as a span), every IndexView::kPointerStride-th
// pointer where all pointers are the running end of the lengths (otherwise
// every pointer), the document index unless it is 0, 1, ..., S, and the modes
// of a multimodal index. Views answer exactly what the parsed view answered,
// entry for entry, whatever it validated: a pointer or document entry that
// breaks the pattern keeps its array, so CheckDocument still finds it.
// Movable; views stay valid across moves.
class CompactIndex {
 public:
  static CompactIndex From(const IndexView& parsed);

  const IndexView& view() const { return view_; }
  absl::Span<const int32_t> lengths() const { return lengths_; }
  // Bytes held.
  uint64_t bytes() const;

 private:
  IndexView view_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;   // all of them, or every kPointerStride-th
  std::vector<int64_t> documents_;  // empty for 0, 1, ..., S
  std::vector<int8_t> modes_;
};

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_COMPACT_INDEX_H_
