#ifndef PACKFEED_DATASET_INDEXED_DATASET_H_
#define PACKFEED_DATASET_INDEXED_DATASET_H_

// Reader for Megatron's indexed dataset (PREFIX.idx + PREFIX.bin).

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/dataset/compact_index.h"
#include "packfeed/dataset/dtype.h"
#include "packfeed/dataset/index_format.h"

namespace packfeed::dataset {

struct IndexedDatasetOptions {
  // Also memory-map PREFIX.bin so ReadMapped() works. Default: false (reads
  // use pread, which turns a file truncated after Open into DataLoss instead
  // of SIGBUS).
  bool map_data = false;
  // kOnUse: Open checks the index's header, size and ends only, and each
  // document is checked by CheckDocument before its entries are trusted
  // (what a daemon opening 10^8 sequences wants: no pass over every entry
  // before the first step).
  IndexValidation validation = IndexValidation::kFull;
};

// An opened dataset, validated as its options ask. The index is read into
// memory at Open (never mapped: a map of a file truncated or failing with EIO
// under a running process kills it with SIGBUS) and kept as a CompactIndex,
// so what the dataset believes about sequence lengths and offsets cannot
// change after validation. Token
// data is read with pread (or through the optional map) into caller buffers,
// and each read checks afterwards that .bin has not been written since
// (size, modification and change time): bytes of a file rewritten in place are never
// returned as tokens the index describes (see CheckUnchanged).
// Thread-safe: all const methods may be called concurrently.
class IndexedDataset {
 public:
  // Opens `prefix`.idx and `prefix`.bin and validates them (see ParseIndex;
  // in addition the .bin must cover the last sequence). NotFound when a file
  // is missing; DataLoss when one is corrupt; InvalidArgument for a prefix
  // that names the .idx/.bin itself.
  static absl::StatusOr<IndexedDataset> Open(absl::string_view prefix,
                                             const IndexedDatasetOptions& options = {});

  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;
  ~IndexedDataset();

  const std::string& prefix() const { return prefix_; }
  const IndexView& index() const { return index_.view(); }
  DType dtype() const { return index().dtype(); }
  uint64_t num_sequences() const { return index().num_sequences(); }
  uint64_t num_documents() const { return index().num_documents(); }
  uint64_t total_tokens() const { return index().total_tokens(); }
  int32_t sequence_length(uint64_t i) const { return index().length(i); }
  // Every sequence's length; valid while the dataset is.
  absl::Span<const int32_t> sequence_lengths() const { return index_.lengths(); }
  uint64_t idx_bytes() const { return idx_size_; }
  // IndexDigest of the .idx as it was read at Open.
  uint64_t idx_digest() const { return idx_digest_; }
  uint64_t bin_bytes() const { return bin_bytes_; }

  // Reads tokens [first_token, first_token + out.size()) of sequence
  // `sequence`, widened to int64. For float dtypes every value must be an
  // integer (DataLoss otherwise). OutOfRange for a sequence or token range
  // outside the data; nothing past the sequence is ever returned.
  absl::Status Read(uint64_t sequence, absl::Span<int64_t> out, uint64_t first_token = 0) const;

  // Reads `count` consecutive sequences starting at `first` with one pread
  // (they are contiguous in .bin); `out` must hold exactly their tokens.
  absl::Status ReadSequences(uint64_t first, uint64_t count, absl::Span<int64_t> out) const;

  // Validates document `document`'s index entries (see dataset::CheckDocument);
  // with kFull validation they passed at Open already.
  absl::Status CheckDocument(uint64_t document) const;

  // Raw bytes [offset, offset + out.size()) of .bin with one pread (more if
  // the kernel returns less). OutOfRange past the index's data; DataLoss
  // when the file ends early (truncated after Open) or was changed since
  // Open (see CheckUnchanged). Every read below fails the same way.
  absl::Status ReadBytes(uint64_t offset, absl::Span<char> out) const;

  // Raw bytes of sequence `sequence` in the on-disk dtype. `out` must be
  // exactly length · dtype size bytes.
  absl::Status ReadRaw(uint64_t sequence, absl::Span<char> out) const;

  // Like Read, through the memory map. FailedPrecondition unless opened with
  // map_data.
  absl::Status ReadMapped(uint64_t sequence, absl::Span<int64_t> out,
                          uint64_t first_token = 0) const;

  // DataLoss naming .bin when it was written since Open: its size or
  // modification time changed, or its change time moved with nothing else
  // to explain it. The change time catches a same-size rewrite whose mtime
  // was restored (rsync --inplace -t, touch -r): no user can set it, and
  // every write moves it. It also moves on chmod, chown, a rename over the
  // path or a delete (the link count), which are no change to the bytes: a
  // change time moved together with the mode, owner or link count is taken
  // as the new baseline. (A file replaced by rename or deleted is no change:
  // the open descriptor still reads the old inode.) Blind spots: a rewrite
  // that comes with such a metadata change before the next read, a rewrite
  // within the filesystem's timestamp granularity of Open (a few ms on
  // Linux's local filesystems; 1-2 s on FAT and some NFS servers), a
  // filesystem that does not keep ctime (some FUSE ones), and, on NFS, a
  // rewrite the client's attribute cache (actimeo) has not seen yet.
  absl::Status CheckUnchanged() const;

  // Bytes of token data fetched from .bin since Open (pread and map reads).
  uint64_t bytes_read() const { return bytes_read_->load(); }

 private:
  // What CheckUnchanged compares.
  struct FileStamp {
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;
    // What else moves the change time without writing a byte.
    uint64_t links = 0;
    uint32_t mode = 0;
    uint32_t uid = 0;
    uint32_t gid = 0;
  };
  static absl::StatusOr<FileStamp> StampOf(int fd, absl::string_view path);

  IndexedDataset(std::string prefix, std::string idx_path, std::string bin_path, CompactIndex index,
                 uint64_t idx_size, uint64_t idx_digest, ScopedFd bin_fd, FileStamp bin_stamp,
                 std::optional<MappedFile> bin_map, IndexValidation validation);
  // Reads out.size() tokens at byte `offset` and widens them; `what` names
  // the sequence(s) in errors.
  absl::Status PreadAndWiden(uint64_t offset, absl::Span<int64_t> out,
                             absl::string_view what) const;
  absl::StatusOr<uint64_t> CheckedByteRange(uint64_t sequence, uint64_t first_token,
                                            uint64_t count) const;

  std::string prefix_;
  std::string idx_path_;
  std::string bin_path_;
  CompactIndex index_;
  uint64_t idx_size_ = 0;
  uint64_t idx_digest_ = 0;
  ScopedFd bin_fd_;
  // At Open, then at the latest metadata-only change (CheckUnchanged);
  // boxed with its mutex so the dataset stays movable.
  struct Baseline {
    absl::Mutex mutex;
    FileStamp stamp ABSL_GUARDED_BY(mutex);
  };
  uint64_t bin_bytes_ = 0;
  std::unique_ptr<Baseline> bin_baseline_;
  std::optional<MappedFile> bin_map_;
  IndexValidation validation_;
  // Boxed so the dataset stays movable.
  std::unique_ptr<std::atomic<uint64_t>> bytes_read_;
};

// Widens `count` elements of `dtype` stored at `raw` (any alignment) into
// `out`; the two must not overlap. For float dtypes, DataLoss naming the
// value when one is not an integer.
absl::Status WidenToInt64(DType dtype, const void* raw, size_t count, int64_t* out);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_INDEXED_DATASET_H_
