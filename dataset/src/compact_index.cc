#include "packfeed/dataset/compact_index.h"

#include "absl/numeric/int128.h"

namespace packfeed::dataset {
namespace {

// Whether every pointer is the end of the sequence before it (from 0).
bool PointersAreRunningEnds(const IndexView& parsed) {
  const uint64_t item = DTypeSize(parsed.dtype());
  absl::uint128 end = 0;
  for (uint64_t i = 0; i < parsed.num_sequences(); ++i) {
    const int32_t length = parsed.length(i);
    const int64_t pointer = parsed.pointer(i);
    if (length < 0 || pointer < 0 || absl::uint128(pointer) != end) return false;
    end += absl::uint128(length) * item;
  }
  return true;
}

bool DocumentsAreSequences(const IndexView& parsed) {
  if (parsed.num_documents() != parsed.num_sequences()) return false;
  for (uint64_t d = 0; d <= parsed.num_documents(); ++d) {
    if (parsed.document_index(d) != static_cast<int64_t>(d)) return false;
  }
  return true;
}

}  // namespace

CompactIndex CompactIndex::From(const IndexView& parsed) {
  CompactIndex out;
  const uint64_t sequences = parsed.num_sequences();
  out.lengths_.resize(sequences);
  for (uint64_t i = 0; i < sequences; ++i) out.lengths_[i] = parsed.length(i);
  const bool derived = PointersAreRunningEnds(parsed);
  const uint64_t stride = derived ? IndexView::kPointerStride : 1;
  out.pointers_.reserve((sequences + stride - 1) / stride);
  for (uint64_t i = 0; i < sequences; i += stride) out.pointers_.push_back(parsed.pointer(i));
  if (!DocumentsAreSequences(parsed)) {
    out.documents_.resize(parsed.num_documents() + 1);
    for (uint64_t d = 0; d < out.documents_.size(); ++d) {
      out.documents_[d] = parsed.document_index(d);
    }
  }
  if (parsed.multimodal()) {
    out.modes_.resize(sequences);
    for (uint64_t i = 0; i < sequences; ++i) out.modes_[i] = parsed.mode(i);
  }

  IndexView& view = out.view_;
  view = parsed;  // the counts, dtype and totals
  view.lengths_ = reinterpret_cast<const uint8_t*>(out.lengths_.data());
  view.pointers_ = derived ? nullptr : reinterpret_cast<const uint8_t*>(out.pointers_.data());
  view.pointer_marks_ = derived ? out.pointers_.data() : nullptr;
  view.documents_ =
      out.documents_.empty() ? nullptr : reinterpret_cast<const uint8_t*>(out.documents_.data());
  view.modes_ = parsed.multimodal() ? reinterpret_cast<const uint8_t*>(out.modes_.data()) : nullptr;
  return out;
}

uint64_t CompactIndex::bytes() const {
  return lengths_.capacity() * sizeof(int32_t) + pointers_.capacity() * sizeof(int64_t) +
         documents_.capacity() * sizeof(int64_t) + modes_.capacity() * sizeof(int8_t);
}

}  // namespace packfeed::dataset
