#ifndef PACKFEED_DATASET_INDEX_FORMAT_H_
#define PACKFEED_DATASET_INDEX_FORMAT_H_

// Megatron's `.idx` format (little-endian, no alignment padding):
//   magic "MMIDIDX\0\0" (9) | uint64 version = 1 | uint8 dtype code |
//   uint64 S | uint64 D+1 | int32 lengths[S] | int64 byte offsets[S] |
//   int64 document_index[D+1] | (multimodal only) int8 modes[S]
// ParseIndex validates that layout without I/O, so the same code serves the
// reader and the fuzzer: every field (IndexValidation::kFull), or the header,
// sizes and ends only, leaving each document to CheckDocument when it is
// first used (kOnUse: opening an index of 10^8 sequences on network storage
// then touches a few pages instead of reading 1.2 GB).

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "packfeed/dataset/dtype.h"

namespace packfeed::dataset {

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr uint64_t kIndexHeaderBytes = 34;

enum class IndexValidation { kFull, kOnUse };

class CompactIndex;

// A validated view of an index held elsewhere: the file's bytes (ParseIndex)
// or a CompactIndex. The file's arrays sit at unaligned offsets (34 is not a
// multiple of 4), so elements are loaded with memcpy, never through typed
// pointers. Cheap to copy; valid while what it views is.
class IndexView {
 public:
  DType dtype() const { return dtype_; }
  uint64_t num_sequences() const { return num_sequences_; }
  // Documents, not the length of the document index (which is one more).
  uint64_t num_documents() const { return num_documents_; }
  bool multimodal() const { return multimodal_; }

  // REQUIRES: i < num_sequences().
  int32_t length(uint64_t i) const { return Load<int32_t>(lengths_, i); }
  int64_t pointer(uint64_t i) const {
    return pointers_ != nullptr ? Load<int64_t>(pointers_, i) : DerivedPointer(i);
  }
  int8_t mode(uint64_t i) const { return multimodal_ ? Load<int8_t>(modes_, i) : 0; }
  // REQUIRES: d <= num_documents().
  int64_t document_index(uint64_t d) const {
    return documents_ != nullptr ? Load<int64_t>(documents_, d) : static_cast<int64_t>(d);
  }

  uint64_t total_tokens() const { return total_tokens_; }
  // Bytes of .bin that the sequences cover: [0, data_bytes()).
  uint64_t data_bytes() const { return data_bytes_; }

 private:
  friend absl::StatusOr<IndexView> ParseIndex(absl::Span<const uint8_t>, absl::string_view,
                                              IndexValidation);
  friend class CompactIndex;
  // Sequences between two kept pointers of a CompactIndex.
  static constexpr uint64_t kPointerStride = 64;

  // A CompactIndex keeps every kPointerStride-th pointer: the rest are its
  // predecessor's end.
  int64_t DerivedPointer(uint64_t i) const {
    const uint64_t mark = i / kPointerStride;
    int64_t tokens = 0;
    for (uint64_t j = mark * kPointerStride; j < i; ++j) tokens += length(j);
    return pointer_marks_[mark] + tokens * static_cast<int64_t>(DTypeSize(dtype_));
  }
  template <typename T>
  static T Load(const uint8_t* base, uint64_t i) {
    T value;
    std::memcpy(&value, base + i * sizeof(T), sizeof(T));
    return value;
  }

  DType dtype_ = DType::kUint8;
  uint64_t num_sequences_ = 0;
  uint64_t num_documents_ = 0;
  bool multimodal_ = false;
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* documents_ = nullptr;
  const uint8_t* modes_ = nullptr;
  // Set when pointers_ is null (see DerivedPointer).
  const int64_t* pointer_marks_ = nullptr;
  uint64_t total_tokens_ = 0;
  uint64_t data_bytes_ = 0;
};

// Validates `bytes` as a whole .idx file: magic, version, dtype code, exact
// size (overflow-safe), lengths >= 0, pointers contiguous from 0 in units of
// the dtype, document index 0 ... S non-decreasing. A multimodal index is
// recognised by its size (S more bytes). Errors: DataLoss for a corrupt file,
// InvalidArgument for an unsupported version; messages name `file_name`, the
// check and the offending values.
// kOnUse checks the header, the exact size, the document index's first and
// last entries and the last sequence's end; total_tokens() is then
// data_bytes() / dtype size, which equals the sum of the lengths exactly
// when every document passes CheckDocument.
absl::StatusOr<IndexView> ParseIndex(absl::Span<const uint8_t> bytes, absl::string_view file_name,
                                     IndexValidation validation = IndexValidation::kFull);

// The checks kFull makes, for the entries document `document` uses: its two
// document index entries are ordered within [0, S]; each of its sequences
// has a non-negative length and starts where the previous sequence ends,
// inside data_bytes(). A view that passed kFull passes for every document.
// OutOfRange for document >= num_documents(); DataLoss naming `file_name`.
absl::Status CheckDocument(const IndexView& index, uint64_t document, absl::string_view file_name);

// A digest of a whole `.idx` (XXH3-64; the fingerprint's record of the
// data): all of it up to 4 MiB; past that, its size and 64 blocks of 64 KiB
// spread evenly from its first byte to its last. Reading a whole index over
// network storage at start-up is what kOnUse validation avoids, so the
// digest samples: a rewrite that keeps the size and changes only bytes
// between the blocks keeps the digest.
uint64_t IndexDigest(absl::Span<const uint8_t> idx);

// Size in bytes of an index with these counts; DataLoss naming the counts
// when it would not fit in an int64 (a corrupt header).
absl::StatusOr<uint64_t> ExpectedIndexBytes(uint64_t num_sequences, uint64_t document_index_entries,
                                            bool multimodal);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_INDEX_FORMAT_H_
