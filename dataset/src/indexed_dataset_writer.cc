#include "packfeed/dataset/indexed_dataset_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/dataset/index_format.h"

namespace packfeed::dataset {
namespace {

constexpr size_t kFlushBytes = size_t{4} << 20;

template <typename T>
void AppendValue(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

void AppendToken(std::string& out, DType dtype, int64_t token) {
  switch (dtype) {
    case DType::kUint8:
      AppendValue(out, static_cast<uint8_t>(token));
      break;
    case DType::kInt8:
      AppendValue(out, static_cast<int8_t>(token));
      break;
    case DType::kInt16:
      AppendValue(out, static_cast<int16_t>(token));
      break;
    case DType::kUint16:
      AppendValue(out, static_cast<uint16_t>(token));
      break;
    case DType::kInt32:
      AppendValue(out, static_cast<int32_t>(token));
      break;
    case DType::kInt64:
      AppendValue(out, token);
      break;
    case DType::kFloat32:
      AppendValue(out, static_cast<float>(token));
      break;
    case DType::kFloat64:
      AppendValue(out, static_cast<double>(token));
      break;
  }
}

absl::StatusOr<ScopedFd> CreateForWrite(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  return ScopedFd(fd);
}

absl::Status Rename(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoToStatus(errno, "rename", from);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IndexedDatasetWriter> IndexedDatasetWriter::Create(absl::string_view prefix,
                                                                  DType dtype, bool multimodal) {
  IndexedDatasetWriter writer;
  writer.prefix_ = std::string(prefix);
  writer.dtype_ = dtype;
  writer.multimodal_ = multimodal;
  PF_ASSIGN_OR_RETURN(writer.bin_, CreateForWrite(absl::StrCat(prefix, ".bin.tmp")));
  return writer;
}

IndexedDatasetWriter::IndexedDatasetWriter(IndexedDatasetWriter&& other) noexcept
    : prefix_(std::exchange(other.prefix_, std::string())),
      dtype_(other.dtype_),
      multimodal_(other.multimodal_),
      finished_(other.finished_),
      bin_(std::move(other.bin_)),
      buffer_(std::move(other.buffer_)),
      bin_offset_(other.bin_offset_),
      lengths_(std::move(other.lengths_)),
      pointers_(std::move(other.pointers_)),
      document_index_(std::move(other.document_index_)),
      modes_(std::move(other.modes_)) {}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finished_ && !prefix_.empty()) {
    ::unlink(absl::StrCat(prefix_, ".bin.tmp").c_str());
    ::unlink(absl::StrCat(prefix_, ".idx.tmp").c_str());
  }
}

absl::Status IndexedDatasetWriter::AddSequence(absl::Span<const int64_t> tokens, int8_t mode) {
  if (finished_) {
    return absl::FailedPreconditionError(absl::StrCat(prefix_, ": AddSequence after Finish"));
  }
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix_, ": sequence ", lengths_.size(), " has ", tokens.size(),
                     " tokens; the format's int32 lengths allow at most 2147483647"));
  }
  const int64_t lo = DTypeMinValue(dtype_);
  const int64_t hi = DTypeMaxValue(dtype_);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < lo || tokens[i] > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix_, ": sequence ", lengths_.size(), " token ", i, " = ", tokens[i],
                       " does not fit dtype ", DTypeName(dtype_), " [", lo, ", ", hi, "]"));
    }
  }
  for (int64_t token : tokens) AppendToken(buffer_, dtype_, token);
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  pointers_.push_back(bin_offset_);
  bin_offset_ += static_cast<int64_t>(tokens.size() * DTypeSize(dtype_));
  if (multimodal_) modes_.push_back(mode);
  if (buffer_.size() >= kFlushBytes) return FlushBuffer();
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::AddEncodedSequence(absl::string_view values) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix_, ": AddEncodedSequence after Finish"));
  }
  const size_t count = values.size() / DTypeSize(dtype_);
  if (values.size() % DTypeSize(dtype_) != 0 ||
      count > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix_, ": ", values.size(), " bytes are not a sequence of ", DTypeName(dtype_)));
  }
  buffer_.append(values.data(), values.size());
  lengths_.push_back(static_cast<int32_t>(count));
  pointers_.push_back(bin_offset_);
  bin_offset_ += static_cast<int64_t>(values.size());
  if (multimodal_) modes_.push_back(0);
  if (buffer_.size() >= kFlushBytes) return FlushBuffer();
  return absl::OkStatus();
}

void IndexedDatasetWriter::EndDocument() {
  document_index_.push_back(static_cast<int64_t>(lengths_.size()));
}

absl::Status IndexedDatasetWriter::AddDocument(absl::Span<const int64_t> tokens,
                                               absl::Span<const int32_t> lengths) {
  uint64_t total = 0;
  for (int32_t length : lengths) {
    if (length < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix_, ": negative sequence length ", length));
    }
    total += static_cast<uint64_t>(length);
  }
  if (total != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, ": document lengths sum to ", total,
                                                   " but ", tokens.size(), " tokens were given"));
  }
  size_t start = 0;
  for (int32_t length : lengths) {
    PF_RETURN_IF_ERROR(AddSequence(tokens.subspan(start, length)));
    start += static_cast<size_t>(length);
  }
  EndDocument();
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::FlushBuffer() {
  PF_RETURN_IF_ERROR(WriteFully(bin_.get(), absl::StrCat(prefix_, ".bin.tmp"), buffer_));
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::Finish() {
  if (finished_) {
    return absl::FailedPreconditionError(absl::StrCat(prefix_, ": Finish called twice"));
  }
  if (document_index_.back() != static_cast<int64_t>(lengths_.size())) {
    EndDocument();
  }
  PF_RETURN_IF_ERROR(FlushBuffer());
  bin_ = ScopedFd();

  std::string index(kIndexMagic, sizeof(kIndexMagic));
  AppendValue<uint64_t>(index, kIndexVersion);
  AppendValue<uint8_t>(index, static_cast<uint8_t>(dtype_));
  AppendValue<uint64_t>(index, lengths_.size());
  AppendValue<uint64_t>(index, document_index_.size());
  auto append_array = [&index](const auto& values) {
    index.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(values[0]));
  };
  append_array(lengths_);
  append_array(pointers_);
  append_array(document_index_);
  if (multimodal_) append_array(modes_);

  const std::string idx_tmp = absl::StrCat(prefix_, ".idx.tmp");
  {
    PF_ASSIGN_OR_RETURN(ScopedFd idx, CreateForWrite(idx_tmp));
    PF_RETURN_IF_ERROR(WriteFully(idx.get(), idx_tmp, index));
  }
  PF_RETURN_IF_ERROR(Rename(absl::StrCat(prefix_, ".bin.tmp"), absl::StrCat(prefix_, ".bin")));
  PF_RETURN_IF_ERROR(Rename(idx_tmp, absl::StrCat(prefix_, ".idx")));
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace packfeed::dataset
