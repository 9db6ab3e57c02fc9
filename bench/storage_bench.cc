// Reading at network-storage latency: packfeedd against Megatron's replicated
// per-rank reads, through slowfs (tests/slowfs, a FUSE filesystem with a set
// latency per request and a bandwidth cap that counts every byte it serves).
//
// For each latency (0, 1 and 5 ms per request), eight ranks of a TP2 x CP2 x
// DP2 job run the same steps, each step "computing" for --compute-ms:
//   - packfeed: a real packfeedd (child process) serves the ranks (threads
//     with the C++ client); it reads the .bin through the mount with
//     direct I/O (each byte once, so the page cache has nothing to add);
//   - replicated: as Megatron's dataset does, every TP and CP rank
//     memory-maps the .bin (through the page cache, readahead as the kernel
//     does it) and reads every sample of its DP rank's share of the step.
// The mount is remounted before each run, so nothing is cached across runs.
// Bytes read are what slowfs counted; distinct bytes are the samples' own.
// next_p50_us/next_p99_us: Next() from the second step on (once read-ahead
// is going), each rank's ring holding 16 microbatches (a whole step).
// startup_s: packfeedd's spawn to every rank attached.
//
// --index-sequences N also measures start-up on an index of N sequences
// through the mount at the highest latency against a full validation of it.
//
//   storage_bench [--steps 12] [--compute-ms 100] [--json] [--quick]

#include <signal.h>
#include <sys/mount.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench_support.h"
#include "child_process.h"
#include "nlohmann/json.hpp"
#include "packfeed/client/client.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/daemon_config.h"
#include "server/config/job_config.h"

namespace packfeed {
namespace {

namespace fs = std::filesystem;

struct Args {
  int steps = 12;
  double compute_ms = 100;
  int64_t docs = 20000;
  int64_t index_sequences = 0;
  int read_threads = 8;
  uint64_t budget_mib = 64;
  bool json = false;
  std::string daemon = PF_PACKFEEDD;
  std::string ctl = PF_PACKFEEDCTL;
  std::string slowfs = PF_SLOWFS;
};

constexpr int kRanks = 8;  // TP2 x CP2 x DP2
constexpr int kGlobalBatch = 64;

struct Figures {
  double latency_ms = 0;
  uint64_t packfeed_bytes_read = 0;
  uint64_t distinct_bytes = 0;           // of the steps run
  uint64_t packfeed_distinct_bytes = 0;  // of the steps the daemon fetched (with read-ahead)
  uint64_t replicated_bytes_read = 0;
  double packfeed_steps_per_s = 0;
  double replicated_steps_per_s = 0;
  double next_p50_us = 0;
  double next_p99_us = 0;
  double startup_s = 0;
  uint64_t peak_bytes_held = 0;
  uint64_t daemon_peak_rss_kib = 0;
};

// slowfs serving `source` at `mount`; unmounted on destruction.
class Mount {
 public:
  static absl::StatusOr<std::unique_ptr<Mount>> Start(const Args& args, const fs::path& source,
                                                      const fs::path& mount, double latency_ms,
                                                      bool direct_bin) {
    fs::create_directories(mount);
    std::vector<std::string> argv = {
        args.slowfs,           source, mount, "-f", absl::StrCat("--latency-ms=", latency_ms),
        "--bandwidth-mib=1024"};
    if (direct_bin) argv.push_back("--direct-io-suffix=.bin");
    absl::StatusOr<testing::ChildProcess> child = testing::ChildProcess::Spawn(argv);
    if (!child.ok()) return child.status();
    std::unique_ptr<Mount> out(new Mount(mount, *std::move(child)));
    for (int i = 0; i < 200 && !fs::exists(mount / ".slowfs"); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (!fs::exists(mount / ".slowfs")) return absl::UnavailableError("slowfs did not mount");
    return out;
  }
  ~Mount() {
    ::umount2(mount_.c_str(), MNT_DETACH);
    (void)child_.Wait(absl::Seconds(10));
  }
  uint64_t BytesRead(const std::string& name) const {
    std::ifstream control(mount_ / ".slowfs");
    const nlohmann::json stats = nlohmann::json::parse(control);
    const auto& files = stats["files"];
    const std::string key = "/" + name;
    return files.contains(key) ? files[key]["bytes"].get<uint64_t>() : 0;
  }

 private:
  Mount(fs::path mount, testing::ChildProcess child)
      : mount_(std::move(mount)), child_(std::move(child)) {}
  fs::path mount_;
  testing::ChildProcess child_;
};

std::string DaemonConfig(const Args& args, const fs::path& dir, const fs::path& prefix) {
  return absl::StrCat("socket_path: \"", (dir / "bench.sock").string(), "\"\n",
                      "memory_budget_bytes: ", args.budget_mib << 20, "\n",
                      "read_threads: ", args.read_threads, "\n", R"(jobs {
  name: "bench"
  datasets { prefix: ")",
                      prefix.string(), R"(" }
  topology { tp: 2 cp: 2 dp: 2 }
  global_batch: )",
                      kGlobalBatch, R"(
  seq_length: 8192
  eod_id: 32000
  append_eod: true
  scheduler { kind: "dynamic_cp" max_tokens_per_rank: 8192 }
})");
}

absl::StatusOr<nlohmann::json> DaemonStats(const Args& args, const fs::path& dir) {
  const std::string command =
      absl::StrCat(args.ctl, " stats --json --socket ", (dir / "bench.sock").string());
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen packfeedctl");
  std::string text;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) text.append(buffer, n);
  if (::pclose(pipe) != 0) return absl::InternalError("packfeedctl stats failed");
  return nlohmann::json::parse(text);
}

// packfeedd serving the eight ranks; fills the packfeed figures.
absl::Status RunPackfeed(const Args& args, const fs::path& dir, const fs::path& prefix,
                         Figures& figures) {
  { std::ofstream(dir / "bench.textproto") << DaemonConfig(args, dir, prefix); }
  const absl::Time spawned = absl::Now();
  absl::StatusOr<testing::ChildProcess> daemon = testing::ChildProcess::Spawn(
      {args.daemon, "--config", dir / "bench.textproto", "--log-level", "warn"});
  if (!daemon.ok()) return daemon.status();
  client::ClientOptions options;
  options.socket_path = dir / "bench.sock";
  options.job = "bench";
  // A ring that holds a whole step: the next step arrives during compute.
  options.slots = 16;
  std::atomic<int> failures{0};
  std::vector<std::vector<double>> latencies(kRanks);
  std::latch attached(kRanks + 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      client::ClientOptions mine = options;
      mine.global_rank = r;
      absl::StatusOr<std::unique_ptr<client::Client>> c =
          bench::AttachWithRetry(mine, absl::Seconds(30));
      attached.count_down();
      if (!c.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, c.status().ToString().c_str());
        ++failures;
        return;
      }
      attached.wait();
      for (int s = 0; s < args.steps; ++s) {
        absl::StatusOr<client::StepInfo> step = (*c)->NextStep(absl::Seconds(120));
        if (!step.ok()) {
          ++failures;
          return;
        }
        for (int m = 0; m < step->num_microbatches; ++m) {
          const absl::Time before = absl::Now();
          absl::StatusOr<client::Microbatch> mb = (*c)->Next(absl::Seconds(120));
          if (s > 0) latencies[r].push_back(absl::ToDoubleMicroseconds(absl::Now() - before));
          if (!mb.ok()) {
            ++failures;
            return;
          }
        }
        absl::SleepFor(absl::Milliseconds(args.compute_ms));  // the step's compute
      }
    });
  }
  attached.arrive_and_wait();
  const absl::Time start = absl::Now();
  figures.startup_s = absl::ToDoubleSeconds(start - spawned);
  for (std::thread& t : threads) t.join();
  figures.packfeed_steps_per_s = args.steps / absl::ToDoubleSeconds(absl::Now() - start);
  if (failures > 0) return absl::InternalError("a packfeed rank failed");
  std::vector<double> all;
  for (const auto& mine : latencies) all.insert(all.end(), mine.begin(), mine.end());
  std::sort(all.begin(), all.end());
  if (!all.empty()) {
    figures.next_p50_us = all[all.size() / 2];
    figures.next_p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  absl::StatusOr<nlohmann::json> stats = DaemonStats(args, dir);
  if (!stats.ok()) return stats.status();
  const nlohmann::json& storage = (*stats)["storage"];
  figures.packfeed_distinct_bytes = std::stoull(storage.value("distinct_bytes", std::string("0")));
  figures.peak_bytes_held = std::stoull(storage.value("peak_bytes_held", std::string("0")));
  figures.daemon_peak_rss_kib = bench::PeakRssKib(daemon->pid());
  daemon->Kill(SIGTERM);
  (void)daemon->Wait(absl::Seconds(20));
  return absl::OkStatus();
}

// Megatron's pattern: each of the 4 TP x CP ranks of a DP rank maps the
// .bin and reads every sample of its DP rank's share.
absl::Status RunReplicated(const Args& args, const fs::path& prefix, Figures& figures) {
  absl::StatusOr<dataset::IndexedDataset> data = dataset::IndexedDataset::Open(prefix.string());
  if (!data.ok()) return data.status();
  absl::StatusOr<MappedFile> bin = MappedFile::Open(prefix.string() + ".bin");
  if (!bin.ok()) return bin.status();
  absl::StatusOr<v1::DaemonConfig> config =
      server::ParseDaemonConfig(DaemonConfig(args, "/tmp", prefix), "bench");
  if (!config.ok()) return config.status();
  absl::StatusOr<scheduler::Sampler> sampler = scheduler::Sampler::Create(
      server::SamplerOptionsOf(config->jobs(0), {static_cast<int64_t>(data->num_documents())}));
  if (!sampler.ok()) return sampler.status();
  const dataset::IndexView& index = data->index();
  const uint64_t item = dataset::DTypeSize(data->dtype());
  auto document_bytes = [&](int64_t document) {
    const auto d = static_cast<uint64_t>(document);
    return static_cast<uint64_t>(index.pointer(index.document_index(d + 1) - 1)) +
           static_cast<uint64_t>(index.length(index.document_index(d + 1) - 1)) * item -
           static_cast<uint64_t>(index.pointer(index.document_index(d)));
  };
  figures.distinct_bytes = 0;
  for (int s = 0; s < args.steps; ++s) {
    for (const scheduler::SampleRef& sample : sampler->GlobalBatch(s)) {
      figures.distinct_bytes += document_bytes(sample.index);
    }
  }
  std::atomic<uint64_t> sink{0};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const int dp = r / 4;  // global rank = tp + 2·(cp + 2·dp)
      uint64_t sum = 0;
      for (int s = 0; s < args.steps; ++s) {
        const std::vector<scheduler::SampleRef> batch = sampler->GlobalBatch(s);
        const size_t share = batch.size() / 2;
        for (size_t i = dp * share; i < (dp + 1) * share; ++i) {
          const int64_t first = index.document_index(static_cast<uint64_t>(batch[i].index));
          const int64_t end = index.document_index(static_cast<uint64_t>(batch[i].index) + 1);
          for (int64_t q = first; q < end; ++q) {
            const uint8_t* bytes = bin->bytes().data() + index.pointer(static_cast<uint64_t>(q));
            const uint64_t length = static_cast<uint64_t>(index.length(static_cast<uint64_t>(q)));
            for (uint64_t b = 0; b < length * item; b += 64) sum += bytes[b];
          }
        }
        absl::SleepFor(absl::Milliseconds(args.compute_ms));
      }
      sink += sum;
    });
  }
  for (std::thread& t : threads) t.join();
  figures.replicated_steps_per_s = args.steps / absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::StatusOr<Figures> Run(const Args& args, const fs::path& dir, double latency_ms) {
  Figures figures;
  figures.latency_ms = latency_ms;
  {
    absl::StatusOr<std::unique_ptr<Mount>> mount =
        Mount::Start(args, dir / "src", dir / "mnt", latency_ms, /*direct_bin=*/true);
    if (!mount.ok()) return mount.status();
    if (absl::Status s = RunPackfeed(args, dir, dir / "mnt" / "data", figures); !s.ok()) return s;
    figures.packfeed_bytes_read = (*mount)->BytesRead("data.bin");
  }
  absl::StatusOr<std::unique_ptr<Mount>> mount =
      Mount::Start(args, dir / "src", dir / "mnt", latency_ms, /*direct_bin=*/false);
  if (!mount.ok()) return mount.status();
  if (absl::Status s = RunReplicated(args, dir / "mnt" / "data", figures); !s.ok()) return s;
  figures.replicated_bytes_read = (*mount)->BytesRead("data.bin");
  return figures;
}

struct StartupFigures {
  uint64_t index_bytes = 0;
  double startup_s = 0;          // packfeedd spawned to a rank attached
  double full_validation_s = 0;  // opening the same index with kFull validation
};

// An index of N one-token sequences, behind the mount at `latency_ms`.
absl::StatusOr<StartupFigures> MeasureStartup(const Args& args, const fs::path& dir,
                                              double latency_ms) {
  const fs::path source = dir / "big-src";
  fs::create_directories(source);
  const std::vector<int64_t> lengths(static_cast<size_t>(args.index_sequences), 16);
  if (absl::Status s = dataset::WriteGeneratedDataset((source / "big").string(), lengths, {});
      !s.ok()) {
    return s;
  }
  StartupFigures figures;
  figures.index_bytes = fs::file_size(source / "big.idx");
  {
    absl::StatusOr<std::unique_ptr<Mount>> mount =
        Mount::Start(args, source, dir / "big-mnt", latency_ms, /*direct_bin=*/true);
    if (!mount.ok()) return mount.status();
    { std::ofstream(dir / "big.textproto") << DaemonConfig(args, dir, dir / "big-mnt" / "big"); }
    const absl::Time spawned = absl::Now();
    absl::StatusOr<testing::ChildProcess> daemon = testing::ChildProcess::Spawn(
        {args.daemon, "--config", dir / "big.textproto", "--log-level", "warn"});
    if (!daemon.ok()) return daemon.status();
    client::ClientOptions options;
    options.socket_path = dir / "bench.sock";
    options.job = "bench";
    absl::StatusOr<std::unique_ptr<client::Client>> c =
        bench::AttachWithRetry(options, absl::Seconds(600));
    if (!c.ok()) return c.status();
    figures.startup_s = absl::ToDoubleSeconds(absl::Now() - spawned);
    c->reset();
    daemon->Kill(SIGTERM);
    (void)daemon->Wait(absl::Seconds(20));
  }
  absl::StatusOr<std::unique_ptr<Mount>> mount =
      Mount::Start(args, source, dir / "big-mnt", latency_ms, /*direct_bin=*/true);
  if (!mount.ok()) return mount.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<dataset::IndexedDataset> full =
      dataset::IndexedDataset::Open((dir / "big-mnt" / "big").string());
  if (!full.ok()) return full.status();
  figures.full_validation_s = absl::ToDoubleSeconds(absl::Now() - start);
  return figures;
}

}  // namespace
}  // namespace packfeed

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  packfeed::Args args;
  bool quick = false;
  CLI::App app{"packfeedd against replicated per-rank reads through a slow filesystem"};
  app.add_option("--steps", args.steps, "steps per run")->capture_default_str();
  app.add_option("--compute-ms", args.compute_ms, "each rank's compute per step")
      ->capture_default_str();
  app.add_option("--docs", args.docs, "documents in the dataset")->capture_default_str();
  app.add_option("--read-threads", args.read_threads, "packfeedd's read_threads")
      ->capture_default_str();
  app.add_option("--budget-mib", args.budget_mib, "packfeedd's memory_budget_bytes, in MiB")
      ->capture_default_str();
  app.add_option("--index-sequences", args.index_sequences,
                 "also time start-up on an index of this many sequences (0: skip)")
      ->capture_default_str();
  app.add_option("--daemon", args.daemon, "packfeedd")->capture_default_str();
  app.add_option("--ctl", args.ctl, "packfeedctl")->capture_default_str();
  app.add_option("--slowfs", args.slowfs, "slowfs")->capture_default_str();
  app.add_flag("--quick", quick, "a short run (smoke test)");
  app.add_flag("--json", args.json, "one JSON object per latency");
  CLI11_PARSE(app, argc, argv);
  if (!fs::exists("/dev/fuse")) {
    std::fprintf(stderr, "storage_bench: skipped: /dev/fuse is missing\n");
    return 77;
  }
  std::vector<double> latencies = {0, 1, 5};
  if (quick) {
    args.steps = 3;
    args.docs = 2000;
    args.compute_ms = 20;
    latencies = {0, 1};
  }
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("pf-storage-bench-", getpid());
  fs::create_directories(dir / "src");
  packfeed::dataset::LengthDistribution dist{128, 8192, 1024, 1.2};
  absl::StatusOr<std::vector<int64_t>> lengths =
      packfeed::dataset::GenerateLengths(dist, args.docs, 1);
  absl::Status written = lengths.ok() ? packfeed::dataset::WriteGeneratedDataset(
                                            (dir / "src" / "data").string(), *lengths, {})
                                      : lengths.status();
  int rc = 0;
  for (double latency : latencies) {
    if (!written.ok()) break;
    absl::StatusOr<packfeed::Figures> f = packfeed::Run(args, dir, latency);
    if (!f.ok()) {
      std::fprintf(stderr, "storage_bench: %s\n", f.status().ToString().c_str());
      rc = 1;
      break;
    }
    const double packfeed_amplification =
        static_cast<double>(f->packfeed_bytes_read) / f->packfeed_distinct_bytes;
    const double replicated_amplification =
        static_cast<double>(f->replicated_bytes_read) / f->distinct_bytes;
    if (args.json) {
      std::printf(
          "{\"latency_ms\":%g,\"packfeed_bytes_read\":%llu,\"distinct_bytes\":%llu,"
          "\"packfeed_distinct_bytes\":%llu,\"packfeed_io_amplification\":%.4f,"
          "\"replicated_bytes_read\":%llu,\"replicated_io_amplification\":%.3f,"
          "\"packfeed_steps_per_s\":%.3f,\"replicated_steps_per_s\":%.3f,"
          "\"next_p50_us\":%.1f,\"next_p99_us\":%.1f,\"startup_s\":%.3f,\"peak_bytes_held\":%llu,"
          "\"memory_budget_bytes\":%llu,\"daemon_peak_rss_kib\":%llu,\"compute_ms\":%g}\n",
          f->latency_ms, static_cast<unsigned long long>(f->packfeed_bytes_read),
          static_cast<unsigned long long>(f->distinct_bytes),
          static_cast<unsigned long long>(f->packfeed_distinct_bytes), packfeed_amplification,
          static_cast<unsigned long long>(f->replicated_bytes_read), replicated_amplification,
          f->packfeed_steps_per_s, f->replicated_steps_per_s, f->next_p50_us, f->next_p99_us,
          f->startup_s, static_cast<unsigned long long>(f->peak_bytes_held),
          static_cast<unsigned long long>(args.budget_mib << 20),
          static_cast<unsigned long long>(f->daemon_peak_rss_kib), args.compute_ms);
    } else {
      std::printf(
          "%g ms/request: packfeed %.2f steps/s, amplification %.4f, Next() p99 %.1f us, "
          "start-up %.2f s, peak held %.1f MiB of %llu; replicated %.2f steps/s, "
          "amplification %.2f\n",
          f->latency_ms, f->packfeed_steps_per_s, packfeed_amplification, f->next_p99_us,
          f->startup_s, f->peak_bytes_held / 1048576.0,
          static_cast<unsigned long long>(args.budget_mib), f->replicated_steps_per_s,
          replicated_amplification);
    }
    std::fflush(stdout);
  }
  if (!written.ok()) {
    std::fprintf(stderr, "storage_bench: %s\n", written.ToString().c_str());
    rc = 1;
  }
  if (rc == 0 && args.index_sequences > 0) {
    absl::StatusOr<packfeed::StartupFigures> startup =
        packfeed::MeasureStartup(args, dir, latencies.back());
    if (!startup.ok()) {
      std::fprintf(stderr, "storage_bench: %s\n", startup.status().ToString().c_str());
      rc = 1;
    } else {
      std::printf(
          "{\"index_sequences\":%lld,\"index_bytes\":%llu,\"latency_ms\":%g,"
          "\"startup_s\":%.3f,\"full_validation_s\":%.3f}\n",
          static_cast<long long>(args.index_sequences),
          static_cast<unsigned long long>(startup->index_bytes), latencies.back(),
          startup->startup_s, startup->full_validation_s);
    }
  }
  fs::remove_all(dir);
  return rc;
}
