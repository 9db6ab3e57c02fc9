// End to end on one node: a real packfeedd (child process) and R client ranks
// (threads, each with its own UCX worker and ring) over shared memory.
// Prints, for two generated datasets 10× apart in size:
//   - tokens/s served to the node (local tokens every rank received / wall);
//   - Next() p50/p99 when the daemon is ahead (the rank pauses between
//     microbatches so its ring is full when it asks);
//   - the daemon's CPU-seconds per GiB of fields delivered while every rank
//     pulls (user + system, /proc/PID/stat);
//   - the daemon's peak RSS (VmHWM), which must not grow with the dataset;
//     its peak private part (RssAnon, sampled: samples read, kept within
//     the memory budget); and at the end its private and shared parts
//     (RssShmem: the ranks' rings it writes in place, which are the ranks'
//     memory, so VmHWM grows with their slots).
//
// With --ring device every rank's ring is in CUDA device memory (UCX built
// with CUDA, a GPU present); with --ring staged each rank's page-locked host
// ring is copied to its device on arrival (a GPU present; a slot's credit
// returns when its copy is done, so the rate is the rate into device
// memory); with --ring daemon each rank's ring is device memory the daemon
// copies every slot into; with --ring tcp every rank attaches over the
// daemon's TCP address (ranks_over_tcp) with UCX over TCP, as a rank on a
// node without a daemon would, its slots travelling as messages. With --experts LAYERSxTOP_K the
// second dataset is the first again, each token also carrying router-replay expert indices (an
// int16 [LAYERS, TOP_K] side field, all layers on every rank: PP 1), and a last line compares the
// two: peak private memory and tokens/s.
//
//   e2e_bench [--ranks 8] [--steps 20] [--docs 20000]
//             [--ring host|ucx|device|staged|daemon|tcp]
//             [--experts 48x8] [--memory-budget-mib N] [--side-read-ahead-mib N]
//             [--packing-threads N] [--quick] [--json]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <latch>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench_support.h"
#include "child_process.h"
#include "packfeed/client/client.h"
#include "packfeed/dataset/dataset_generator.h"

namespace packfeed {
namespace {

struct Args {
  int ranks = 8;
  int steps = 20;
  int64_t docs = 20000;
  bool quick = false;
  bool json = false;
  std::string ring = "host";
  int tcp_port = 0;                  // --ring tcp: the daemon's admin_tcp_address port
  std::string experts;               // LAYERSxTOP_K, or empty
  uint64_t memory_budget_mib = 0;    // 0: the daemon's default
  uint64_t side_read_ahead_mib = 0;  // 0: the daemon's default
  uint32_t packing_threads = 0;      // 0: the daemon's default
};

struct Figures {
  int64_t docs = 0;
  uint64_t dataset_bytes = 0;
  double tokens_per_s = 0;
  double bytes_per_s = 0;  // every field of every slot received
  double daemon_cpu_s_per_gib = 0;
  double next_p50_us = 0;
  double next_p99_us = 0;
  uint64_t daemon_peak_rss_kib = 0;
  // RssAnon sampled every millisecond: the daemon's own memory, without
  // the ranks' rings it maps to write in place (VmHWM counts those).
  uint64_t daemon_peak_private_kib = 0;
  uint64_t daemon_anon_kib = 0;
  uint64_t daemon_shmem_kib = 0;
};

std::string Config(const std::string& dir, const std::string& prefix, int ranks,
                   const dataset::GeneratedSideField* experts, const Args& args) {
  // TP2 × CP2 × DP(ranks/4), dynamic CP: the quick start's shape.
  const std::string side =
      experts == nullptr
          ? ""
          : absl::StrCat("  model { num_layers: ", experts->layers, " }\n",
                         "  side_fields { name: \"routed_experts\" dtype: \"int16\" inner_shape: [",
                         experts->layers, ", ", experts->top_k,
                         "] pad_value: -1 layer_axis: true }\n");
  // --ring tcp: ranks as on a node without a daemon, over TCP.
  const std::string over_tcp =
      args.ring != "tcp" ? ""
                         : absl::StrCat("admin_tcp_address: \"127.0.0.1:", args.tcp_port,
                                        "\"\nadmin_tcp_token: \"bench\"\nranks_over_tcp: true\n"
                                        "ranks_over_tcp_without_tls: true\n");
  return absl::StrCat(
      "socket_path: \"", dir, "/bench.sock\"\n", over_tcp,
      "memory_budget_bytes: ", args.memory_budget_mib << 20, "\n",
      args.side_read_ahead_mib == 0
          ? ""
          : absl::StrCat("side_rows_read_ahead_bytes: ", args.side_read_ahead_mib << 20, "\n"),
      args.packing_threads == 0 ? ""
                                : absl::StrCat("packing_threads: ", args.packing_threads, "\n"),
      R"(jobs {
  name: "bench"
  datasets { prefix: ")",
      prefix, R"(" }
  topology { tp: 2 cp: 2 dp: )",
      std::max(1, ranks / 4), R"( }
  global_batch: 64
  seq_length: 8192
  eod_id: 32000
  append_eod: true
  auth_token: "bench"
  scheduler { kind: "dynamic_cp" max_tokens_per_rank: 8192 }
)",
      side, "}\n");
}

// A TCP port of the loopback nobody listens on now (the kernel's pick).
int FreeTcpPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), size) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
    port = ntohs(address.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

using bench::AttachWithRetry;
using bench::CpuSeconds;
using bench::PeakRssKib;

// The largest RssAnon of `pid` while it lives.
class PrivatePeak {
 public:
  explicit PrivatePeak(pid_t pid)
      : thread_([this, pid] {
          while (!stop_.load()) {
            peak_ = std::max(peak_.load(), bench::StatusKib(pid, "RssAnon"));
            absl::SleepFor(absl::Milliseconds(1));
          }
        }) {}
  ~PrivatePeak() { Stop(); }
  uint64_t Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return peak_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

absl::StatusOr<Figures> Run(const Args& args, const std::string& daemon_path, int64_t docs,
                            bool with_experts) {
  const std::string dir =
      std::filesystem::temp_directory_path() / absl::StrCat("pf-e2e-bench-", getpid(), "-", docs);
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/data";
  dataset::LengthDistribution dist{128, 8192, 1024, 1.2};
  absl::StatusOr<std::vector<int64_t>> lengths = dataset::GenerateLengths(dist, docs, 1);
  if (!lengths.ok()) return lengths.status();
  if (absl::Status s = dataset::WriteGeneratedDataset(prefix, *lengths, {}); !s.ok()) return s;
  std::optional<dataset::GeneratedSideField> experts;
  if (with_experts) {
    absl::StatusOr<dataset::GeneratedSideField> parsed = dataset::ParseGeneratedSideField(
        absl::StrCat("routed_experts:experts:", args.experts, ":256"));
    if (!parsed.ok()) return parsed.status();
    experts = *parsed;
    if (absl::Status s =
            dataset::WriteGeneratedSideField(prefix + "_routed_experts", *lengths, *experts, 1);
        !s.ok()) {
      return s;
    }
  }
  Figures figures;
  figures.docs = docs;
  figures.dataset_bytes = std::filesystem::file_size(prefix + ".bin");
  const int ranks = std::max(4, args.ranks / 4 * 4);
  {
    std::ofstream(dir + "/bench.textproto")
        << Config(dir, prefix, ranks, experts ? &*experts : nullptr, args);
  }
  absl::StatusOr<testing::ChildProcess> daemon = testing::ChildProcess::Spawn(
      {daemon_path, "--config", dir + "/bench.textproto", "--log-level", "warn"});
  if (!daemon.ok()) return daemon.status();
  PrivatePeak private_peak(daemon->pid());

  client::ClientOptions options;
  options.socket_path = dir + "/bench.sock";
  options.job = "bench";
  options.placement = args.ring == "device"   ? packfeed::RingPlacement::kDevice
                      : args.ring == "staged" ? packfeed::RingPlacement::kStagedDevice
                      : args.ring == "daemon" ? packfeed::RingPlacement::kDaemonDevice
                                              : packfeed::RingPlacement::kHost;
  options.auth_token = "bench";
  // A host ring in UCX's shared memory, rather than a memfd the client
  // hands to the daemon (the default).
  if (args.ring == "ucx") options.sharing = client::RingSharing::kUcx;
  if (args.ring == "tcp") {
    options.daemon_address = absl::StrCat("127.0.0.1:", args.tcp_port);
    options.ucx_transports = "tcp";
  }

  // Throughput: every rank as fast as it can.
  std::atomic<int64_t> tokens{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  // The clock starts when every rank is attached.
  std::latch attached(ranks + 1);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      client::ClientOptions mine = options;
      mine.global_rank = r;
      absl::StatusOr<std::unique_ptr<client::Client>> c =
          AttachWithRetry(mine, absl::Seconds(10), absl::Milliseconds(100));
      attached.count_down();
      if (!c.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, c.status().ToString().c_str());
        ++failures;
        return;
      }
      if (!(*c)->DeviceRingFallback().empty()) {
        // Its figures would be the staged ring's: not what was asked for.
        std::fprintf(stderr, "rank %d: no device ring the daemon writes: %s\n", r,
                     (*c)->DeviceRingFallback().c_str());
        ++failures;
      }
      attached.wait();
      for (int s = 0; s < args.steps; ++s) {
        absl::StatusOr<client::StepInfo> step = (*c)->NextStep(absl::Seconds(60));
        if (!step.ok()) {
          ++failures;
          return;
        }
        for (int m = 0; m < step->num_microbatches; ++m) {
          absl::StatusOr<client::Microbatch> mb = (*c)->Next(absl::Seconds(60));
          if (!mb.ok()) {
            ++failures;
            return;
          }
          tokens += mb->Field("padding_mask")->shape[1];
          for (const client::FieldView& field : mb->fields) bytes += field.bytes;
        }
      }
    });
  }
  attached.arrive_and_wait();
  const absl::Time start = absl::Now();
  const double cpu_before = CpuSeconds(daemon->pid());
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (failures > 0) return absl::InternalError("a rank failed");
  figures.daemon_cpu_s_per_gib =
      (CpuSeconds(daemon->pid()) - cpu_before) / (static_cast<double>(bytes) / (1 << 30));
  figures.tokens_per_s = static_cast<double>(tokens) / seconds;
  figures.bytes_per_s = static_cast<double>(bytes) / seconds;

  // Next() latency with the daemon ahead: one rank that pauses first.
  {
    client::ClientOptions mine = options;
    mine.global_rank = 0;
    mine.start_step = args.steps;
    absl::StatusOr<std::unique_ptr<client::Client>> c =
        AttachWithRetry(mine, absl::Seconds(10), absl::Milliseconds(100));
    if (!c.ok()) return c.status();
    std::vector<double> latencies;
    for (int s = 0; s < args.steps; ++s) {
      absl::StatusOr<client::StepInfo> step = (*c)->NextStep(absl::Seconds(60));
      if (!step.ok()) return step.status();
      for (int m = 0; m < step->num_microbatches; ++m) {
        absl::SleepFor(absl::Milliseconds(2));  // the trainer computes; the ring fills
        const absl::Time before = absl::Now();
        absl::StatusOr<client::Microbatch> mb = (*c)->Next(absl::Seconds(60));
        latencies.push_back(absl::ToDoubleMicroseconds(absl::Now() - before));
        if (!mb.ok()) return mb.status();
      }
    }
    std::sort(latencies.begin(), latencies.end());
    figures.next_p50_us = latencies[latencies.size() / 2];
    figures.next_p99_us = latencies[std::min(latencies.size() - 1, latencies.size() * 99 / 100)];
  }
  figures.daemon_peak_rss_kib = PeakRssKib(daemon->pid());
  figures.daemon_peak_private_kib = private_peak.Stop();
  figures.daemon_anon_kib = bench::StatusKib(daemon->pid(), "RssAnon");
  figures.daemon_shmem_kib = bench::StatusKib(daemon->pid(), "RssShmem");
  daemon->Kill(SIGTERM);
  (void)daemon->Wait(absl::Seconds(20));
  std::filesystem::remove_all(dir);
  return figures;
}

}  // namespace
}  // namespace packfeed

int main(int argc, char** argv) {
  packfeed::Args args;
  std::string daemon = PF_PACKFEEDD;
  CLI::App app{"packfeedd + client ranks end to end on one node"};
  app.add_option("--ranks", args.ranks, "client ranks (a multiple of 4)")->capture_default_str();
  app.add_option("--steps", args.steps, "steps per rank")->capture_default_str();
  app.add_option("--docs", args.docs, "documents of the smaller dataset (the other has 10×)")
      ->capture_default_str();
  app.add_option("--daemon", daemon, "packfeedd binary")->capture_default_str();
  app.add_option("--ring", args.ring,
                 "where each rank's ring lives: host (a memfd the daemon maps), ucx (host, in "
                 "UCX's shared memory), device (CUDA, written by UCX), staged (host, copied to "
                 "the device on arrival), daemon (CUDA, copied in by the daemon) or tcp (host, "
                 "the ranks attached over TCP as from another node, UCX over TCP)")
      ->check(CLI::IsMember({"host", "ucx", "device", "staged", "daemon", "tcp"}));
  app.add_option("--experts", args.experts,
                 "LAYERSxTOP_K: add int16 router-replay indices per token (e.g. 48x8)");
  app.add_option("--memory-budget-mib", args.memory_budget_mib,
                 "the daemon's memory_budget_bytes in MiB (0: its default)");
  app.add_option("--packing-threads", args.packing_threads,
                 "the daemon's packing_threads (0: its default)");
  app.add_option("--side-read-ahead-mib", args.side_read_ahead_mib,
                 "the daemon's side_rows_read_ahead_bytes in MiB (0: its default)");
  app.add_flag("--quick", args.quick, "a short run (smoke test)");
  app.add_flag("--json", args.json, "one JSON object per dataset");
  CLI11_PARSE(app, argc, argv);
  if (args.ring == "tcp") args.tcp_port = packfeed::FreeTcpPort();
  if (args.quick) {
    args.ranks = 4;
    args.steps = 3;
    args.docs = 500;
  }
  // The 10× dataset shows the daemon's memory does not grow with the data.
  // With experts (768 B per token at 48x8, too large for a small disk at
  // 10×) the same dataset is served plain first, to compare in one run.
  std::vector<std::pair<int64_t, bool>> runs = {{args.docs, false}};
  runs.emplace_back(args.experts.empty() ? args.docs * 10 : args.docs, !args.experts.empty());
  std::vector<packfeed::Figures> done;
  for (const auto& [docs, with_experts] : runs) {
    absl::StatusOr<packfeed::Figures> f = packfeed::Run(args, daemon, docs, with_experts);
    if (!f.ok()) {
      std::fprintf(stderr, "e2e_bench: %s\n", f.status().ToString().c_str());
      return 1;
    }
    done.push_back(*f);
    if (args.json) {
      std::printf(
          "{\"docs\":%lld,\"dataset_bytes\":%llu,\"tokens_per_s\":%.0f,\"bytes_per_s\":%.0f,"
          "\"daemon_cpu_s_per_gib\":%.3f,\"next_p50_us\":%.1f,\"next_p99_us\":%.1f,\"daemon_peak_"
          "rss_kib\":%llu,\"daemon_peak_private_kib\":%llu,\"side_field\":%s,"
          "\"daemon_anon_kib\":%llu,\"daemon_shmem_kib\":%llu}\n",
          static_cast<long long>(f->docs), static_cast<unsigned long long>(f->dataset_bytes),
          f->tokens_per_s, f->bytes_per_s, f->daemon_cpu_s_per_gib, f->next_p50_us, f->next_p99_us,
          static_cast<unsigned long long>(f->daemon_peak_rss_kib),
          static_cast<unsigned long long>(f->daemon_peak_private_kib),
          with_experts ? "true" : "false", static_cast<unsigned long long>(f->daemon_anon_kib),
          static_cast<unsigned long long>(f->daemon_shmem_kib));
    } else {
      std::printf(
          "dataset %8lld docs (%7.1f MiB): %7.2f M tokens/s served (%6.2f GiB/s of fields, "
          "daemon %5.2f CPU-s/GiB), Next() p50 %6.1f us p99 %6.1f us (daemon ahead), daemon peak "
          "RSS %6.1f MiB, peak private %6.1f MiB (at the end: %6.1f private, %6.1f the ranks' "
          "rings)%s\n",
          static_cast<long long>(f->docs), f->dataset_bytes / 1048576.0, f->tokens_per_s / 1e6,
          f->bytes_per_s / (1 << 30), f->daemon_cpu_s_per_gib, f->next_p50_us, f->next_p99_us,
          f->daemon_peak_rss_kib / 1024.0, f->daemon_peak_private_kib / 1024.0,
          f->daemon_anon_kib / 1024.0, f->daemon_shmem_kib / 1024.0,
          with_experts ? absl::StrCat(", side field ", args.experts).c_str() : "");
    }
    std::fflush(stdout);
  }
  if (!args.experts.empty() && !args.json) {
    // The side field's cost in the daemon's own memory, same run.
    std::printf("side field %s: peak private %.2fx plain, tokens/s %.2fx plain\n",
                args.experts.c_str(),
                static_cast<double>(done[1].daemon_peak_private_kib) /
                    static_cast<double>(std::max<uint64_t>(1, done[0].daemon_peak_private_kib)),
                done[1].tokens_per_s / done[0].tokens_per_s);
  }
  return 0;
}
