// Reads every sequence of a generated dataset into int64 buffers and compares
// the rate with a single-thread memcpy of the same bytes, in the same run.
//   dataset_read_bench [--gib 1] [--dir /tmp] [--dtype uint16] [--repeats 3]
//                      [--index-sequences 10000000]
// The file is in the page cache (just written), so this measures the reader's
// CPU cost (syscalls, widening), not the storage.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "packfeed/common/posix_file.h"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/dataset/indexed_dataset.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best of `repeats` runs, in seconds (the least disturbed by the noisy host).
double BestSeconds(int repeats, const std::function<void()>& body) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

void Check(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "dataset_read_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
}

// Resident set size of this process, anonymous and file-backed, in bytes.
std::pair<uint64_t, uint64_t> Resident() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0, shared = 0;
  if (statm == nullptr || std::fscanf(statm, "%llu %llu %llu", &size, &resident, &shared) != 3) {
    resident = shared = 0;
  }
  if (statm != nullptr) std::fclose(statm);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return {(resident - shared) * page, shared * page};
}

// Drops `path` from the page cache (clean pages), so the next open reads it.
void Evict(const std::string& path) {
  absl::StatusOr<packfeed::ScopedFd> fd = packfeed::OpenForRead(path);
  Check(fd.status());
  ::posix_fadvise(fd->get(), 0, 0, POSIX_FADV_DONTNEED);
}

// What opening a large index costs now (read into memory: no SIGBUS when it
// changes under the daemon) against mapping it as before, in the same run:
// an index of `sequences` one-token sequences, from the page cache and after
// evicting it; then the lengths walked once, as planning does.
void IndexOpenFigures(const std::string& dir, uint64_t sequences, int repeats) {
  const std::string prefix = dir + "/packfeed_open_bench";
  packfeed::dataset::GeneratedDatasetOptions options;
  options.vocab_size = 1000;
  Check(packfeed::dataset::WriteGeneratedDataset(prefix, std::vector<int64_t>(sequences, 1),
                                                 options));
  const std::string idx = prefix + ".idx";
  packfeed::dataset::IndexedDatasetOptions read_options;
  read_options.validation = packfeed::dataset::IndexValidation::kOnUse;
  auto walk = [](const packfeed::dataset::IndexView& index) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < index.num_sequences(); ++i) {
      sum += static_cast<uint64_t>(index.length(i));
    }
    if (sum != index.num_sequences()) std::exit(2);
  };
  std::printf("\nopening an index of %llu sequences (%.0f MB), best of %d\n",
              static_cast<unsigned long long>(sequences), std::filesystem::file_size(idx) / 1e6,
              repeats);
  std::printf("%-34s %10s %10s %14s %14s\n", "", "warm s", "cold s", "+anon RSS MB",
              "+file RSS MB");
  for (const bool mapped : {true, false}) {
    double seconds[2] = {1e30, 1e30};
    std::pair<uint64_t, uint64_t> grew;
    for (const bool cold : {false, true}) {
      for (int r = 0; r < repeats; ++r) {
        if (cold) Evict(idx);
        const auto before = Resident();
        const auto start = Clock::now();
        if (mapped) {
          absl::StatusOr<packfeed::MappedFile> map = packfeed::MappedFile::Open(idx);
          Check(map.status());
          absl::StatusOr<packfeed::dataset::IndexView> view = packfeed::dataset::ParseIndex(
              map->bytes(), idx, packfeed::dataset::IndexValidation::kOnUse);
          Check(view.status());
          walk(*view);
          const auto after = Resident();
          grew = {after.first - before.first, after.second - before.second};
        } else {
          absl::StatusOr<packfeed::dataset::IndexedDataset> dataset =
              packfeed::dataset::IndexedDataset::Open(prefix, read_options);
          Check(dataset.status());
          walk(dataset->index());
          const auto after = Resident();
          grew = {after.first - before.first, after.second - before.second};
        }
        seconds[cold] =
            std::min(seconds[cold], std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
    std::printf("%-34s %10.3f %10.3f %14.0f %14.0f\n",
                mapped ? "mapped (before), lengths walked" : "read into memory, lengths walked",
                seconds[0], seconds[1], grew.first / 1e6, grew.second / 1e6);
  }
  std::filesystem::remove(idx);
  std::filesystem::remove(prefix + ".bin");
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 1.0;
  std::string dir = std::filesystem::temp_directory_path().string();
  std::string dtype_name = "uint16";
  int repeats = 3;
  CLI::App app{"Indexed dataset read throughput against memcpy"};
  app.add_option("--gib", gib, "Dataset size in GiB")->capture_default_str();
  app.add_option("--dir", dir, "Scratch directory")->capture_default_str();
  app.add_option("--dtype", dtype_name, "Token dtype")->capture_default_str();
  app.add_option("--repeats", repeats, "Runs per figure (best is kept)")->capture_default_str();
  uint64_t index_sequences = 10'000'000;
  app.add_option("--index-sequences", index_sequences,
                 "Sequences of the index whose opening is timed (0: skip)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<packfeed::dataset::DType> dtype = packfeed::dataset::DTypeFromName(dtype_name);
  Check(dtype.status());
  const size_t item = packfeed::dataset::DTypeSize(*dtype);
  const uint64_t target_tokens = static_cast<uint64_t>(gib * (uint64_t{1} << 30)) / item;

  // Lengths from the SFT trace's distribution until the target size.
  packfeed::dataset::LengthDistribution dist;
  std::vector<int64_t> lengths;
  uint64_t tokens = 0;
  for (uint64_t seed = 0; tokens < target_tokens; ++seed) {
    absl::StatusOr<std::vector<int64_t>> chunk =
        packfeed::dataset::GenerateLengths(dist, 4096, seed);
    Check(chunk.status());
    for (int64_t length : *chunk) {
      if (tokens >= target_tokens) break;
      length = std::min<int64_t>(length, target_tokens - tokens);
      lengths.push_back(length);
      tokens += static_cast<uint64_t>(length);
    }
  }
  const std::string prefix = dir + "/packfeed_read_bench";
  packfeed::dataset::GeneratedDatasetOptions options;
  options.dtype = *dtype;
  options.vocab_size = std::min<int64_t>(32000, packfeed::dataset::DTypeMaxValue(*dtype));
  std::printf("generating %.2f GiB (%zu sequences, %llu tokens, %s) in %s\n",
              tokens * item / double(1 << 30), lengths.size(),
              static_cast<unsigned long long>(tokens), dtype_name.c_str(), dir.c_str());
  Check(packfeed::dataset::WriteGeneratedDataset(prefix, lengths, options));

  packfeed::dataset::IndexedDatasetOptions open_options;
  open_options.map_data = true;
  absl::StatusOr<packfeed::dataset::IndexedDataset> dataset =
      packfeed::dataset::IndexedDataset::Open(prefix, open_options);
  Check(dataset.status());
  const uint64_t bytes = dataset->index().data_bytes();
  const uint64_t n = dataset->num_sequences();
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());

  // Coalesced reads: batches of whole sequences of about 16 MiB of int64.
  std::vector<std::pair<uint64_t, uint64_t>> batches;  // first, tokens
  for (uint64_t first = 0; first < n;) {
    uint64_t count = 0, batch_tokens = 0;
    while (first + count < n && batch_tokens < (uint64_t{1} << 21)) {
      batch_tokens += static_cast<uint64_t>(lengths[first + count]);
      ++count;
    }
    batches.emplace_back(first, batch_tokens);
    first += count;
  }
  uint64_t max_batch = 0;
  for (auto& [first, batch_tokens] : batches) {
    max_batch = std::max(max_batch, batch_tokens);
  }
  std::vector<int64_t> buffer(std::max<uint64_t>(max_batch, longest));

  const double per_sequence = BestSeconds(repeats, [&] {
    for (uint64_t i = 0; i < n; ++i) {
      Check(dataset->Read(i, absl::MakeSpan(buffer.data(), lengths[i])));
    }
  });
  const double mapped = BestSeconds(repeats, [&] {
    for (uint64_t i = 0; i < n; ++i) {
      Check(dataset->ReadMapped(i, absl::MakeSpan(buffer.data(), lengths[i])));
    }
  });
  const double coalesced = BestSeconds(repeats, [&] {
    for (size_t b = 0; b < batches.size(); ++b) {
      const uint64_t first = batches[b].first;
      const uint64_t end = b + 1 < batches.size() ? batches[b + 1].first : n;
      Check(dataset->ReadSequences(first, end - first,
                                   absl::MakeSpan(buffer.data(), batches[b].second)));
    }
  });
  // memcpy of the same bytes: the raw .bin, from the page-cache map into a
  // buffer, in the same 16 MiB-of-output-sized steps.
  absl::StatusOr<packfeed::MappedFile> bin = packfeed::MappedFile::Open(prefix + ".bin");
  Check(bin.status());
  std::vector<char> destination(size_t{16} << 20);
  const double copy = BestSeconds(repeats, [&] {
    for (uint64_t at = 0; at < bytes; at += destination.size()) {
      const size_t chunk = std::min<uint64_t>(destination.size(), bytes - at);
      std::memcpy(destination.data(), bin->bytes().data() + at, chunk);
    }
  });
  std::printf("sequences %llu, mean length %.0f, raw bytes %.3f GB\n",
              static_cast<unsigned long long>(n), double(tokens) / n, bytes / 1e9);
  const double memcpy_gbs = bytes / copy / 1e9;
  std::printf("%-28s %8s %10s\n", "method", "GB/s", "vs memcpy");
  std::printf("%-28s %8.2f %10.2f\n", "memcpy (same raw bytes)", memcpy_gbs, 1.0);
  for (auto [name, seconds] :
       {std::pair{"pread per sequence", per_sequence},
        std::pair{"pread coalesced batches", coalesced}, std::pair{"mmap per sequence", mapped}}) {
    const double gbs = bytes / seconds / 1e9;
    std::printf("%-28s %8.2f %10.2f\n", name, gbs, gbs / memcpy_gbs);
  }
  std::printf("(GB/s of raw dataset bytes; int64 output is %zux larger)\n", 8 / item);
  // Every read ends in one fstat of .bin (IndexedDataset::CheckUnchanged):
  // its share of the reads above.
  absl::StatusOr<packfeed::ScopedFd> bin_fd = packfeed::OpenForRead(prefix + ".bin");
  Check(bin_fd.status());
  const double stats = BestSeconds(repeats, [&] {
    struct stat info;
    for (uint64_t i = 0; i < n; ++i) ::fstat(bin_fd->get(), &info);
  });
  std::printf(
      "change check (one fstat per read): %.0f ns, %.1f%% of pread per sequence, "
      "%.2f%% of coalesced batches\n",
      stats / n * 1e9, 100 * stats / per_sequence, 100 * stats * batches.size() / n / coalesced);
  std::filesystem::remove(prefix + ".idx");
  std::filesystem::remove(prefix + ".bin");
  if (index_sequences > 0) IndexOpenFigures(dir, index_sequences, repeats);
  return 0;
}
