#include "packfeed/dataset/index_format.h"

#include <xxhash.h>

#include <limits>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packfeed::dataset {
namespace {

template <typename T>
T LoadAt(absl::Span<const uint8_t> bytes, uint64_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

absl::Status Corrupt(absl::string_view file, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(file, ": ", what));
}

}  // namespace

absl::StatusOr<uint64_t> ExpectedIndexBytes(uint64_t num_sequences, uint64_t document_index_entries,
                                            bool multimodal) {
  // 128-bit arithmetic: S and D come from the file and may be anything.
  absl::uint128 size = kIndexHeaderBytes;
  size += absl::uint128(num_sequences) * (4 + 8 + (multimodal ? 1 : 0));
  size += absl::uint128(document_index_entries) * 8;
  if (size > absl::uint128(std::numeric_limits<int64_t>::max())) {
    return absl::DataLossError(absl::StrCat("index size overflows: ", num_sequences,
                                            " sequences and ", document_index_entries,
                                            " document index entries"));
  }
  return absl::Uint128Low64(size);
}

namespace {

struct IndexHeader {
  DType dtype;
  uint64_t num_sequences = 0;
  uint64_t doc_entries = 0;
  bool multimodal = false;
};

// The header, checked against the file's size.
absl::StatusOr<IndexHeader> ParseHeader(absl::Span<const uint8_t> bytes, absl::string_view f) {
  if (bytes.size() < kIndexHeaderBytes) {
    return Corrupt(f, absl::StrCat("truncated header: ", bytes.size(), " bytes, a header needs ",
                                   kIndexHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return Corrupt(f,
                   "bad magic: not a Megatron indexed dataset index "
                   "(expected \"MMIDIDX\\0\\0\")");
  }
  const uint64_t version = LoadAt<uint64_t>(bytes, 9);
  if (version != kIndexVersion) {
    return absl::InvalidArgumentError(absl::StrCat(f, ": unsupported index version ", version,
                                                   " (this reader supports version ", kIndexVersion,
                                                   ")"));
  }
  const uint8_t dtype_code = LoadAt<uint8_t>(bytes, 17);
  absl::StatusOr<DType> dtype = DTypeFromCode(dtype_code);
  if (!dtype.ok()) return Corrupt(f, dtype.status().message());

  IndexHeader header{*dtype, LoadAt<uint64_t>(bytes, 18), LoadAt<uint64_t>(bytes, 26), false};
  const uint64_t num_sequences = header.num_sequences;
  const uint64_t doc_entries = header.doc_entries;
  if (doc_entries == 0) {
    return Corrupt(f,
                   "document index has 0 entries (it must hold at least "
                   "the leading 0)");
  }
  absl::StatusOr<uint64_t> plain_size = ExpectedIndexBytes(num_sequences, doc_entries, false);
  absl::StatusOr<uint64_t> multimodal_size = ExpectedIndexBytes(num_sequences, doc_entries, true);
  // The multimodal size is the larger, so it alone can overflow.
  if (!multimodal_size.ok()) {
    return Corrupt(f, multimodal_size.status().message());
  }
  if (bytes.size() == *plain_size) {
    header.multimodal = false;
  } else if (bytes.size() == *multimodal_size) {
    header.multimodal = true;
  } else {
    return Corrupt(f, absl::StrCat(bytes.size() < *plain_size ? "truncated" : "oversized",
                                   ": file has ", bytes.size(), " bytes but ", num_sequences,
                                   " sequences and ", doc_entries, " document index entries need ",
                                   *plain_size, " (or ", *multimodal_size, " with modes)"));
  }
  return header;
}

// kOnUse: the data's bytes from the ends alone (the document index's first
// and last entries, the last sequence).
absl::StatusOr<uint64_t> DataBytesFromEnds(const IndexView& view, uint64_t item,
                                           absl::string_view f) {
  const uint64_t num_sequences = view.num_sequences();
  const int64_t first = view.document_index(0);
  const int64_t last = view.document_index(view.num_documents());
  if (first != 0 || last < 0 || static_cast<uint64_t>(last) != num_sequences) {
    return Corrupt(f, absl::StrCat("document index runs from ", first, " to ", last,
                                   ", expected 0 to the sequence count ", num_sequences));
  }
  if (num_sequences == 0) return 0;
  const int32_t length = view.length(num_sequences - 1);
  const int64_t pointer = view.pointer(num_sequences - 1);
  if (length < 0 || pointer < 0) {
    return Corrupt(f, absl::StrCat("the last sequence has length ", length, " at byte ", pointer));
  }
  // pointer < 2^63 and length·item < 2^34: no overflow.
  return static_cast<uint64_t>(pointer) + static_cast<uint64_t>(length) * item;
}

struct DataExtent {
  uint64_t bytes = 0;
  uint64_t tokens = 0;
};

// kFull: sequence i occupies [ptr_i, ptr_i + len_i·size) and the next one
// starts right there. The running end cannot overflow: S·(2^31−1)·8 < 2^63
// because S < 2^63/12 (the header's size check).
absl::StatusOr<DataExtent> CheckSequences(const IndexView& view, absl::string_view f) {
  const uint64_t item = DTypeSize(view.dtype());
  absl::uint128 end = 0;
  uint64_t tokens = 0;
  for (uint64_t i = 0; i < view.num_sequences(); ++i) {
    const int32_t length = view.length(i);
    if (length < 0) {
      return Corrupt(f, absl::StrCat("sequence ", i, " has negative length ", length));
    }
    const int64_t pointer = view.pointer(i);
    if (pointer < 0 || absl::uint128(pointer) != end) {
      return Corrupt(f, absl::StrCat("sequence ", i, " starts at byte ", pointer,
                                     " but the lengths and dtype ", DTypeName(view.dtype()),
                                     " put it at byte ", absl::Uint128Low64(end)));
    }
    end += absl::uint128(length) * item;
    tokens += static_cast<uint64_t>(length);
  }
  return DataExtent{absl::Uint128Low64(end), tokens};
}

// kFull: the document index runs from 0 to the sequence count, never down.
absl::Status CheckDocumentIndex(const IndexView& view, absl::string_view f) {
  const uint64_t doc_entries = view.num_documents() + 1;
  const int64_t first = view.document_index(0);
  if (first != 0) {
    return Corrupt(f, absl::StrCat("document index starts at ", first, ", expected 0"));
  }
  for (uint64_t d = 1; d < doc_entries; ++d) {
    const int64_t previous = view.document_index(d - 1);
    const int64_t current = view.document_index(d);
    if (current < previous) {
      return Corrupt(f, absl::StrCat("document index decreases at entry ", d, ": ", previous,
                                     " then ", current));
    }
  }
  const int64_t last = view.document_index(doc_entries - 1);
  if (last < 0 || static_cast<uint64_t>(last) != view.num_sequences()) {
    return Corrupt(f, absl::StrCat("document index ends at ", last,
                                   ", expected the sequence count ", view.num_sequences()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IndexView> ParseIndex(absl::Span<const uint8_t> bytes, absl::string_view file_name,
                                     IndexValidation validation) {
  absl::StatusOr<IndexHeader> header = ParseHeader(bytes, file_name);
  if (!header.ok()) return header.status();
  const uint64_t num_sequences = header->num_sequences;
  IndexView view;
  view.dtype_ = header->dtype;
  view.num_sequences_ = num_sequences;
  view.num_documents_ = header->doc_entries - 1;
  view.multimodal_ = header->multimodal;
  view.lengths_ = bytes.data() + kIndexHeaderBytes;
  view.pointers_ = view.lengths_ + 4 * num_sequences;
  view.documents_ = view.pointers_ + 8 * num_sequences;
  view.modes_ = header->multimodal ? view.documents_ + 8 * header->doc_entries : nullptr;

  if (validation == IndexValidation::kOnUse) {
    const uint64_t item = DTypeSize(header->dtype);
    absl::StatusOr<uint64_t> data_bytes = DataBytesFromEnds(view, item, file_name);
    if (!data_bytes.ok()) return data_bytes.status();
    view.data_bytes_ = *data_bytes;
    view.total_tokens_ = view.data_bytes_ / item;
    return view;
  }
  absl::StatusOr<DataExtent> extent = CheckSequences(view, file_name);
  if (!extent.ok()) return extent.status();
  view.data_bytes_ = extent->bytes;
  view.total_tokens_ = extent->tokens;
  if (absl::Status documents = CheckDocumentIndex(view, file_name); !documents.ok()) {
    return documents;
  }
  return view;
}

absl::Status CheckDocument(const IndexView& index, uint64_t document, absl::string_view file_name) {
  const absl::string_view f = file_name;
  if (document >= index.num_documents()) {
    return absl::OutOfRangeError(absl::StrCat(
        f, ": document ", document, " out of range (the index has ", index.num_documents(), ")"));
  }
  const int64_t first = index.document_index(document);
  const int64_t end = index.document_index(document + 1);
  if (first < 0 || end < first || static_cast<uint64_t>(end) > index.num_sequences()) {
    return Corrupt(f, absl::StrCat("document ", document, " spans sequences [", first, ", ", end,
                                   ") of ", index.num_sequences()));
  }
  const uint64_t item = DTypeSize(index.dtype());
  // Where sequence `first` must start: where its predecessor ends.
  uint64_t expected = 0;
  if (first > 0) {
    const int32_t length = index.length(static_cast<uint64_t>(first - 1));
    const int64_t pointer = index.pointer(static_cast<uint64_t>(first - 1));
    if (length < 0 || pointer < 0) {
      return Corrupt(
          f, absl::StrCat("sequence ", first - 1, " has length ", length, " at byte ", pointer));
    }
    expected = static_cast<uint64_t>(pointer) + static_cast<uint64_t>(length) * item;
  }
  for (uint64_t i = static_cast<uint64_t>(first); i < static_cast<uint64_t>(end); ++i) {
    const int32_t length = index.length(i);
    if (length < 0) {
      return Corrupt(f, absl::StrCat("sequence ", i, " has negative length ", length));
    }
    const int64_t pointer = index.pointer(i);
    if (pointer < 0 || static_cast<uint64_t>(pointer) != expected) {
      return Corrupt(f, absl::StrCat("sequence ", i, " starts at byte ", pointer,
                                     " but the lengths and dtype ", DTypeName(index.dtype()),
                                     " put it at byte ", expected));
    }
    expected += static_cast<uint64_t>(length) * item;
    if (expected > index.data_bytes()) {
      return Corrupt(f, absl::StrCat("sequence ", i, " ends at byte ", expected,
                                     ", past the data's end at byte ", index.data_bytes()));
    }
  }
  return absl::OkStatus();
}

uint64_t IndexDigest(absl::Span<const uint8_t> idx) {
  constexpr uint64_t kWhole = uint64_t{4} << 20;
  constexpr uint64_t kBlock = uint64_t{64} << 10;
  constexpr uint64_t kBlocks = 64;
  if (idx.size() <= kWhole) return XXH3_64bits(idx.data(), idx.size());
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  const uint64_t size = idx.size();
  XXH3_64bits_update(state, &size, sizeof(size));
  for (uint64_t i = 0; i < kBlocks; ++i) {
    const uint64_t offset = (size - kBlock) * i / (kBlocks - 1);
    XXH3_64bits_update(state, idx.data() + offset, kBlock);
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

}  // namespace packfeed::dataset
