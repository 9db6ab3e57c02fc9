#ifndef PACKFEED_DATASET_INDEXED_DATASET_WRITER_H_
#define PACKFEED_DATASET_INDEXED_DATASET_WRITER_H_

// Writes Megatron's indexed dataset format, byte for byte as Megatron's
// IndexedDatasetBuilder does for the same sequences and documents.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/dataset/dtype.h"

namespace packfeed::dataset {

// Streams token data to PREFIX.bin.tmp and writes the index on Finish(),
// then renames both into place, so an interrupted write never leaves a
// readable but incomplete PREFIX.idx/.bin pair. Move-only;
// thread-compatible.
class IndexedDatasetWriter {
 public:
  // `multimodal`: also write one int8 mode per sequence.
  static absl::StatusOr<IndexedDatasetWriter> Create(absl::string_view prefix, DType dtype,
                                                     bool multimodal = false);
  IndexedDatasetWriter(IndexedDatasetWriter&& other) noexcept;
  IndexedDatasetWriter& operator=(IndexedDatasetWriter&&) = delete;
  ~IndexedDatasetWriter();  // Removes the temporary files unless finished.

  // Appends one sequence (Megatron's add_item). InvalidArgument, writing
  // nothing, when a token does not fit the dtype or the sequence is longer
  // than an int32 length allows.
  absl::Status AddSequence(absl::Span<const int64_t> tokens, int8_t mode = 0);

  // Appends one sequence of values already encoded in the dataset's dtype
  // (little-endian; floats as they are). InvalidArgument when the bytes are
  // not whole values.
  absl::Status AddEncodedSequence(absl::string_view values);
  // Closes the current document (Megatron's end_document).
  void EndDocument();

  // Appends the sequences `lengths` cut from `tokens` and closes a document
  // (Megatron's add_document). The lengths must sum to tokens.size().
  absl::Status AddDocument(absl::Span<const int64_t> tokens, absl::Span<const int32_t> lengths);

  // Closes a document left open, writes the index and renames both files
  // into place. FailedPrecondition when called twice.
  absl::Status Finish();

  uint64_t num_sequences() const { return lengths_.size(); }

 private:
  IndexedDatasetWriter() = default;
  absl::Status FlushBuffer();

  std::string prefix_;
  DType dtype_ = DType::kUint16;
  bool multimodal_ = false;
  bool finished_ = false;
  ScopedFd bin_;
  std::string buffer_;  // Encoded tokens not yet written to .bin.
  int64_t bin_offset_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> document_index_ = {0};
  std::vector<int8_t> modes_;
};

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_INDEXED_DATASET_WRITER_H_
