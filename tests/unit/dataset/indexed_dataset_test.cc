#include "packfeed/dataset/indexed_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index_test_util.h"
#include "test_paths.h"

namespace packfeed::dataset {
namespace {

using ::testing::HasSubstr;

// Three uint16 sequences of lengths 2, 3, 1 in two documents.
RawIndex ValidIndex() { return RawIndex::Contiguous(DType::kUint16, {2, 3, 1}, {0, 2, 3}); }
// Their tokens: 1 2 | 3 4 5 | 6, as uint16.
std::string ValidBin() {
  std::string bin;
  for (uint16_t token : {1, 2, 3, 4, 5, 6}) {
    bin.append(reinterpret_cast<const char*>(&token), 2);
  }
  return bin;
}

class DatasetFiles {
 public:
  // Writes PREFIX.idx/.bin (nullopt: leave the file out).
  absl::StatusOr<IndexedDataset> Open(std::optional<std::string> idx,
                                      std::optional<std::string> bin,
                                      IndexedDatasetOptions options = {}) {
    if (idx) testing::WriteFileBytes(prefix() + ".idx", *idx);
    if (bin) testing::WriteFileBytes(prefix() + ".bin", *bin);
    return IndexedDataset::Open(prefix(), options);
  }
  std::string prefix() const { return dir_.Prefix("data"); }

 private:
  testing::ScopedTempDir dir_;
};

struct BadInput {
  std::string name;
  std::function<void(std::string& idx, std::string& bin)> corrupt;
  absl::StatusCode code;
  std::string message;
};

std::function<void(std::string&, std::string&)> Rewrite(std::function<void(RawIndex&)> edit) {
  return [edit](std::string& idx, std::string&) {
    RawIndex raw = ValidIndex();
    edit(raw);
    idx = raw.Serialize();
  };
}

std::function<void(std::string&, std::string&)> TruncateIndexTo(size_t size) {
  return [size](std::string& idx, std::string&) { idx.resize(size); };
}

// S = 3, D + 1 = 3: header 34, lengths end at 46, pointers at 70, documents
// at 94.
std::vector<BadInput> BadInputs() {
  using absl::StatusCode;
  const auto kLoss = StatusCode::kDataLoss;
  return {
      {"empty index", TruncateIndexTo(0), kLoss, "truncated header: 0 bytes, a header needs 34"},
      {"index cut inside magic", TruncateIndexTo(5), kLoss, "truncated header: 5 bytes"},
      {"index cut after version", TruncateIndexTo(17), kLoss, "truncated header: 17 bytes"},
      {"index cut inside counts", TruncateIndexTo(33), kLoss, "truncated header: 33 bytes"},
      {"index with header only", TruncateIndexTo(34), kLoss,
       "truncated: file has 34 bytes but 3 sequences and 3 document index "
       "entries need 94"},
      {"index cut inside lengths", TruncateIndexTo(40), kLoss, "truncated: file has 40 bytes"},
      {"index cut at lengths|pointers", TruncateIndexTo(46), kLoss, "truncated: file has 46 bytes"},
      {"index cut at pointers|documents", TruncateIndexTo(70), kLoss,
       "truncated: file has 70 bytes"},
      {"index missing its last byte", TruncateIndexTo(93), kLoss, "truncated: file has 93 bytes"},
      {"index with trailing garbage", [](std::string& idx, std::string&) { idx += "xy"; }, kLoss,
       "oversized: file has 96 bytes but 3 sequences and 3 document index "
       "entries need 94 (or 97 with modes)"},
      {"bad magic", Rewrite([](RawIndex& r) { r.magic[0] = 'X'; }), kLoss, "bad magic"},
      {"magic without padding", Rewrite([](RawIndex& r) { r.magic[8] = 1; }), kLoss, "bad magic"},
      {"version 2", Rewrite([](RawIndex& r) { r.version = 2; }), StatusCode::kInvalidArgument,
       "unsupported index version 2"},
      {"version 0", Rewrite([](RawIndex& r) { r.version = 0; }), StatusCode::kInvalidArgument,
       "unsupported index version 0"},
      {"dtype code 0", Rewrite([](RawIndex& r) { r.dtype_code = 0; }), kLoss,
       "unknown dtype code 0"},
      {"dtype code 9", Rewrite([](RawIndex& r) { r.dtype_code = 9; }), kLoss,
       "unknown dtype code 9"},
      {"dtype disagrees with pointers", Rewrite([](RawIndex& r) { r.dtype_code = 4; }), kLoss,
       "sequence 1 starts at byte 4 but the lengths and dtype int32 put it at "
       "byte 8"},
      {"sequence count overflows",
       Rewrite([](RawIndex& r) { r.sequence_count = uint64_t{1} << 61; }), kLoss,
       "index size overflows"},
      {"document count overflows", Rewrite([](RawIndex& r) { r.document_entries = ~uint64_t{0}; }),
       kLoss, "index size overflows"},
      {"sequence count disagrees with arrays", Rewrite([](RawIndex& r) { r.sequence_count = 4; }),
       kLoss, "4 sequences and 3 document index entries need 106"},
      {"zero document index entries", Rewrite([](RawIndex& r) {
         r.document_entries = 0;
         r.documents.clear();
       }),
       kLoss, "document index has 0 entries"},
      {"negative length", Rewrite([](RawIndex& r) { r.lengths[1] = -3; }), kLoss,
       "sequence 1 has negative length -3"},
      {"first pointer not zero", Rewrite([](RawIndex& r) { r.pointers[0] = 2; }), kLoss,
       "sequence 0 starts at byte 2 but the lengths and dtype uint16 put "
       "it at byte 0"},
      {"pointer gap", Rewrite([](RawIndex& r) { r.pointers[2] = 12; }), kLoss,
       "sequence 2 starts at byte 12 but the lengths and dtype uint16 put it "
       "at byte 10"},
      {"negative pointer", Rewrite([](RawIndex& r) { r.pointers[1] = -4; }), kLoss,
       "sequence 1 starts at byte -4"},
      {"document index starts at 1", Rewrite([](RawIndex& r) { r.documents[0] = 1; }), kLoss,
       "document index starts at 1, expected 0"},
      {"document index decreases", Rewrite([](RawIndex& r) {
         r.documents = {0, 3, 2};
       }),
       kLoss, "document index decreases at entry 2: 3 then 2"},
      {"document index ends short", Rewrite([](RawIndex& r) { r.documents[2] = 2; }), kLoss,
       "document index ends at 2, expected the sequence count 3"},
      {"document index ends past the sequences", Rewrite([](RawIndex& r) { r.documents[2] = 7; }),
       kLoss, "document index ends at 7, expected the sequence count 3"},
      {"bin one byte short", [](std::string&, std::string& bin) { bin.pop_back(); }, kLoss,
       "truncated data: file has 11 bytes but the index's 3 sequences end at "
       "byte 12"},
      {"empty bin", [](std::string&, std::string& bin) { bin.clear(); }, kLoss,
       "truncated data: file has 0 bytes"},
  };
}

TEST(IndexedDatasetTest, RejectsEveryBadInputWithItsReason) {
  const std::vector<BadInput> cases = BadInputs();
  ASSERT_GE(cases.size(), 20u);
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.name);
    std::string idx = ValidIndex().Serialize();
    std::string bin = ValidBin();
    c.corrupt(idx, bin);
    DatasetFiles files;
    absl::StatusOr<IndexedDataset> dataset = files.Open(idx, bin);
    ASSERT_FALSE(dataset.ok());
    EXPECT_EQ(dataset.status().code(), c.code) << dataset.status();
    EXPECT_THAT(dataset.status().message(), HasSubstr(c.message));
    // Every message names the file it is about.
    EXPECT_THAT(dataset.status().message(), HasSubstr(files.prefix()));
  }
}

TEST(IndexedDatasetTest, ValidFilesOpen) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), ValidBin());
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_sequences(), 3u);
  EXPECT_EQ(dataset->num_documents(), 2u);
  EXPECT_EQ(dataset->total_tokens(), 6u);
  EXPECT_EQ(dataset->idx_bytes(), 94u);
  EXPECT_EQ(dataset->bin_bytes(), 12u);
  // The digest is of the file as read, though the dataset keeps less of it.
  const std::string idx = ValidIndex().Serialize();
  EXPECT_EQ(dataset->idx_digest(),
            IndexDigest({reinterpret_cast<const uint8_t*>(idx.data()), idx.size()}));
  EXPECT_EQ(dataset->sequence_lengths().size(), 3u);
}

TEST(IndexedDatasetTest, MissingIndexIsNotFound) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(std::nullopt, ValidBin());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr("data.idx"));
}

TEST(IndexedDatasetTest, MissingBinIsNotFound) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), std::nullopt);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr("data.bin"));
}

TEST(IndexedDatasetTest, PrefixWithExtensionIsInvalidArgument) {
  absl::StatusOr<IndexedDataset> dataset = IndexedDataset::Open("/tmp/x.idx");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr("without the extension"));
}

TEST(IndexedDatasetTest, IndexThatIsADirectoryIsInvalidArgument) {
  testing::ScopedTempDir dir;
  ASSERT_EQ(::mkdir(dir.Prefix("d.idx").c_str(), 0755), 0);
  absl::StatusOr<IndexedDataset> dataset = IndexedDataset::Open(dir.Prefix("d"));
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr("not a regular file"));
}

TEST(IndexedDatasetTest, LongerBinIsAccepted) {
  // Megatron's reader accepts trailing bytes; they are never returned.
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), ValidBin() + "zz");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int64_t> tokens(1);
  ASSERT_TRUE(dataset->Read(2, absl::MakeSpan(tokens)).ok());
  EXPECT_EQ(tokens[0], 6);
  EXPECT_EQ(dataset->Read(3, absl::MakeSpan(tokens)).code(), absl::StatusCode::kOutOfRange);
}

TEST(IndexedDatasetTest, ReadsEveryPathAndCountsBytes) {
  DatasetFiles files;
  IndexedDatasetOptions options;
  options.map_data = true;
  absl::StatusOr<IndexedDataset> dataset =
      files.Open(ValidIndex().Serialize(), ValidBin(), options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int64_t> tokens(3);
  ASSERT_TRUE(dataset->Read(1, absl::MakeSpan(tokens)).ok());
  EXPECT_THAT(tokens, ::testing::ElementsAre(3, 4, 5));
  std::vector<int64_t> tail(2);
  ASSERT_TRUE(dataset->Read(1, absl::MakeSpan(tail), 1).ok());
  EXPECT_THAT(tail, ::testing::ElementsAre(4, 5));
  std::vector<int64_t> mapped(3);
  ASSERT_TRUE(dataset->ReadMapped(1, absl::MakeSpan(mapped)).ok());
  EXPECT_EQ(mapped, tokens);
  std::vector<int64_t> all(6);
  ASSERT_TRUE(dataset->ReadSequences(0, 3, absl::MakeSpan(all)).ok());
  EXPECT_THAT(all, ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
  char raw[4];
  ASSERT_TRUE(dataset->ReadRaw(0, absl::MakeSpan(raw, 4)).ok());
  EXPECT_EQ(raw[0], 1);
  EXPECT_EQ(raw[2], 2);
  EXPECT_EQ(dataset->bytes_read(), 6u + 4u + 6u + 12u + 4u);
}

TEST(IndexedDatasetTest, OutOfRangeReadsReturnNothing) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), ValidBin());
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int64_t> tokens(3, -1);
  absl::Status past_end = dataset->Read(7, absl::MakeSpan(tokens));
  EXPECT_EQ(past_end.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(past_end.message(), HasSubstr("sequence 7 out of range"));
  absl::Status too_long = dataset->Read(0, absl::MakeSpan(tokens));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(too_long.message(), HasSubstr("of length 2"));
  EXPECT_THAT(tokens, ::testing::Each(-1));
  EXPECT_EQ(dataset->ReadSequences(2, 2, absl::MakeSpan(tokens)).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(dataset->ReadSequences(0, 2, absl::MakeSpan(tokens)).code(),
            absl::StatusCode::kInvalidArgument);
  char raw[3];
  EXPECT_EQ(dataset->ReadRaw(0, absl::MakeSpan(raw, 3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dataset->bytes_read(), 0u);
}

TEST(IndexedDatasetTest, ReadMappedNeedsTheMapOption) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), ValidBin());
  ASSERT_TRUE(dataset.ok());
  std::vector<int64_t> tokens(2);
  EXPECT_EQ(dataset->ReadMapped(0, absl::MakeSpan(tokens)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(IndexedDatasetTest, BinTruncatedAfterOpenIsDataLossNotGarbage) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), ValidBin());
  ASSERT_TRUE(dataset.ok());
  ASSERT_EQ(::truncate((files.prefix() + ".bin").c_str(), 4), 0);
  std::vector<int64_t> tokens(3);
  absl::Status status = dataset->Read(1, absl::MakeSpan(tokens));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("end of file"));
}

// The index is read at Open: cutting or removing it afterwards changes
// nothing the dataset serves (a mapped index would SIGBUS here).
TEST(IndexedDatasetTest, IndexTruncatedOrRemovedAfterOpenKeepsWhatWasValidated) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), ValidBin());
  ASSERT_TRUE(dataset.ok());
  const std::string idx = files.prefix() + ".idx";
  ASSERT_EQ(::truncate(idx.c_str(), 0), 0);
  ASSERT_EQ(::unlink(idx.c_str()), 0);
  EXPECT_EQ(dataset->sequence_length(2), 1);
  std::vector<int64_t> tokens(3);
  ASSERT_TRUE(dataset->Read(1, absl::MakeSpan(tokens)).ok());
  EXPECT_EQ(tokens, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_TRUE(dataset->CheckDocument(1).ok());
}

TEST(IndexedDatasetTest, BinRewrittenInPlaceIsDataLossNotTheNewBytes) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), ValidBin());
  ASSERT_TRUE(dataset.ok());
  // Same size, other tokens, and a modification time that surely differs
  // from Open's (the kernel's clock may not have ticked since).
  const std::string bin = files.prefix() + ".bin";
  std::string other = ValidBin();
  other[2] = 9;
  testing::WriteFileBytes(bin, other);
  const struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, bin.c_str(), times, 0), 0);
  std::vector<int64_t> tokens(3);
  absl::Status status = dataset->Read(1, absl::MakeSpan(tokens));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr(".bin: changed since it was opened"));
  std::vector<char> raw(6);
  EXPECT_EQ(dataset->ReadRaw(1, absl::MakeSpan(raw)).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(dataset->ReadBytes(0, absl::MakeSpan(raw)).code(), absl::StatusCode::kDataLoss);
  std::vector<int64_t> two(5);
  EXPECT_EQ(dataset->ReadSequences(0, 2, absl::MakeSpan(two)).code(), absl::StatusCode::kDataLoss);
}

// rsync --inplace -t and touch -r: the same size, other bytes, and the
// modification time Open saw put back. Only the change time, which no user
// can set, tells. A chmod before it moves the change time too, and is no
// change to the bytes.
TEST(IndexedDatasetTest, BinRewrittenWithItsSizeAndModificationTimeRestoredIsDataLoss) {
  DatasetFiles files;
  const std::string bin = files.prefix() + ".bin";
  // Open a tick after the file was made, so that the rewrite's change time
  // cannot share the coarse clock's tick with what Open saw.
  testing::WriteFileBytes(bin, ValidBin());
  absl::SleepFor(absl::Milliseconds(50));
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), std::nullopt);
  ASSERT_TRUE(dataset.ok());
  struct stat opened;
  ASSERT_EQ(::stat(bin.c_str(), &opened), 0);
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_EQ(::chmod(bin.c_str(), 0640), 0);
  std::vector<int64_t> tokens(3);
  ASSERT_TRUE(dataset->Read(1, absl::MakeSpan(tokens)).ok()) << "a chmod is no rewrite";
  absl::SleepFor(absl::Milliseconds(50));

  std::string other = ValidBin();
  other[2] = 9;
  {
    // In place: the same inode.
    ScopedFd fd(::open(bin.c_str(), O_WRONLY));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(::pwrite(fd.get(), other.data(), other.size(), 0),
              static_cast<ssize_t>(other.size()));
  }
  const struct timespec times[2] = {opened.st_atim, opened.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, bin.c_str(), times, 0), 0);
  struct stat now;
  ASSERT_EQ(::stat(bin.c_str(), &now), 0);
  ASSERT_EQ(now.st_size, opened.st_size);
  ASSERT_EQ(now.st_ino, opened.st_ino);
  ASSERT_EQ(now.st_mtim.tv_sec, opened.st_mtim.tv_sec);
  ASSERT_EQ(now.st_mtim.tv_nsec, opened.st_mtim.tv_nsec);

  const absl::Status status = dataset->Read(1, absl::MakeSpan(tokens));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(".bin: changed since it was opened"));
}

// Replaced by rename, deleted, or made unreadable: the open descriptor still
// reads the inode the index describes, so serving goes on.
TEST(IndexedDatasetTest, BinReplacedRemovedOrLockedAfterOpenStillReadsWhatWasOpened) {
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(ValidIndex().Serialize(), ValidBin());
  ASSERT_TRUE(dataset.ok());
  const std::string bin = files.prefix() + ".bin";
  ASSERT_EQ(::chmod(bin.c_str(), 0), 0);
  testing::WriteFileBytes(bin + ".new", std::string(12, '\x7f'));
  ASSERT_EQ(::rename((bin + ".new").c_str(), bin.c_str()), 0);
  std::vector<int64_t> tokens(3);
  ASSERT_TRUE(dataset->Read(1, absl::MakeSpan(tokens)).ok());
  EXPECT_EQ(tokens, (std::vector<int64_t>{3, 4, 5}));
  ASSERT_EQ(::unlink(bin.c_str()), 0);
  ASSERT_TRUE(dataset->Read(1, absl::MakeSpan(tokens)).ok());
  EXPECT_EQ(tokens, (std::vector<int64_t>{3, 4, 5}));
}

TEST(IndexedDatasetTest, NonIntegerFloatTokenIsDataLoss) {
  RawIndex raw = RawIndex::Contiguous(DType::kFloat32, {2}, {0, 1});
  std::string bin;
  for (float value : {3.0f, 2.5f}) {
    bin.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(raw.Serialize(), bin);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int64_t> tokens(2);
  absl::Status status = dataset->Read(0, absl::MakeSpan(tokens));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("value 2.5 at element 1"));
}

TEST(IndexedDatasetTest, ReadsSequencesLongerThanTheStagingBuffer) {
  // 100 000 int32 tokens = 400 KB: several staging blocks.
  testing::ScopedTempDir dir;
  std::vector<int32_t> lengths = {100000, 3};
  RawIndex raw = RawIndex::Contiguous(DType::kInt32, lengths, {0, 2});
  std::string bin;
  for (int32_t i = 0; i < 100003; ++i) {
    const int32_t token = i * 7 - 5;
    bin.append(reinterpret_cast<const char*>(&token), 4);
  }
  DatasetFiles files;
  absl::StatusOr<IndexedDataset> dataset = files.Open(raw.Serialize(), bin);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int64_t> tokens(100003);
  ASSERT_TRUE(dataset->ReadSequences(0, 2, absl::MakeSpan(tokens)).ok());
  for (int64_t i = 0; i < 100003; ++i) ASSERT_EQ(tokens[i], i * 7 - 5);
  std::vector<int64_t> tail(50000);
  ASSERT_TRUE(dataset->Read(0, absl::MakeSpan(tail), 50000).ok());
  EXPECT_EQ(tail.front(), 50000 * 7 - 5);
  EXPECT_EQ(tail.back(), 99999 * 7 - 5);
}

}  // namespace
}  // namespace packfeed::dataset
