// Transport throughput and notification latency between two processes on
// this machine, beside single-thread memcpy of the same sizes measured in the
// same run (docs/TARGETS.md: ≥ 80 % of memcpy for slots of 1 MiB and more).
//
// The parent is the sender; it spawns itself as the receiver. For each slot
// size: throughput with a full window of credits (the receiver releases each
// slot as soon as it sees it), one-way latency from the start of Push to the
// receiver's Next() with one slot in flight, and, where the ring is mapped
// into the sender (same-node shared memory), the in-place path (memcpy into
// the mapped slot + CommitMapped). Throughputs are medians of 9 rounds.
//
// With --ring device the receiver's ring is in CUDA device memory (UCX built
// with CUDA) and the baseline is a synchronous host→device cudaMemcpy of the
// same sizes from pageable memory. With --ring staged the ring is the
// page-locked host ring whose slots the receiver copies to device memory on
// arrival (a credit returns when the copy is done, so the put rate is the
// rate into device memory) and the baseline is cudaMemcpy from page-locked
// memory. With --ring daemon the ring is device memory the receiver exports
// by descriptor and the sender imports and copies each slot into from its
// page-locked staging (RingPlacement::kDaemonDevice); the baseline is the
// page-locked cudaMemcpy. All three need a GPU.
//
//   transport_bench [--tls sm,self] [--slots 4] [--ring host|device|staged|daemon] [--json]
//                   [--quick]

#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "child_process.h"
#include "packfeed/transport/cuda_memory.h"
#include "packfeed/transport/receiver.h"
#include "packfeed/transport/sender.h"
#include "packfeed/transport/shared_ring.h"
#include "transport_harness.h"

namespace packfeed {
namespace {

using testing::ChildProcess;
using transport::ElementType;
using transport::Receiver;
using transport::Sender;

constexpr uint64_t kMaxSlot = 64ull << 20;

struct Flags {
  std::string role = "sender";
  std::string transports = "sm,self";
  uint32_t slots = 4;
  bool json = false;
  bool quick = false;
  int spin_us = 50;
  std::string ring = "host";
  int receiver_uid = -1;                // run the receiver as this uid (from root)
  bool receiver_pid_namespace = false;  // and in a PID namespace of its own (from root)
  std::string ring_socket;              // internal: where a shared ring's descriptor goes
  // The bytes end in device memory.
  bool device() const { return ring == "device" || ring == "staged" || ring == "daemon"; }
  // The ring's descriptor travels over a Unix socket, as to the daemon.
  bool by_descriptor() const { return ring == "shared" || ring == "daemon"; }
  transport::RingPlacement placement() const {
    if (ring == "device") return transport::RingPlacement::kDevice;
    if (ring == "staged") return transport::RingPlacement::kStagedDevice;
    if (ring == "daemon") return transport::RingPlacement::kDaemonDevice;
    return transport::RingPlacement::kHost;
  }
};

sockaddr_un UnixAddress(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  path.copy(address.sun_path, sizeof(address.sun_path) - 1);
  return address;
}

uint64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Die(const absl::Status& status) {
  fprintf(stderr, "transport_bench: %s\n", testing::StatusLine(status).c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) Die(value.status());
  return std::move(*value);
}
void Check(const absl::Status& status) {
  if (!status.ok()) Die(status);
}

// The receiving process: releases every slot at once and reports, per run,
// each slot's one-way latency (its Next() time minus the stamp the sender
// put in the inline metadata; both read CLOCK_MONOTONIC on one host).
int RunReceiver(const Flags& flags) {
  transport::ReceiverOptions options;
  options.ucx.transports = flags.transports;
  options.slots = flags.slots;
  options.slot_bytes = kMaxSlot;
  options.placement = flags.placement();
  options.spin = absl::Microseconds(flags.spin_us);
  options.shared_by_fd = flags.ring == "shared";
  if (flags.receiver_uid >= 0 && (setgroups(0, nullptr) != 0 || setgid(flags.receiver_uid) != 0 ||
                                  setuid(flags.receiver_uid) != 0)) {
    Die(ErrnoToStatus(errno, "setuid", absl::StrCat(flags.receiver_uid)));
  }
  std::unique_ptr<Receiver> receiver = Check(Receiver::Create(options));
  Check(testing::SendFrame(testing::kControlFd, receiver->worker_address()));
  Check(testing::SendFrame(testing::kControlFd, receiver->ring_descriptor()));
  if (flags.by_descriptor()) {
    ScopedFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const sockaddr_un address = UnixAddress(flags.ring_socket);
    if (connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
      Die(ErrnoToStatus(errno, "connect", flags.ring_socket));
    }
    Check(transport::SendWithFd(socket.get(), transport::FormatRingOffer(receiver->ring_offer()),
                                receiver->ring_fd()));
  }
  while (true) {
    absl::StatusOr<std::string> command =
        testing::ReceiveFrame(testing::kControlFd, absl::Minutes(10));
    if (!command.ok()) return 0;
    const std::vector<std::string> words = absl::StrSplit(*command, ' ');
    if (words[0] == "connect" && words.size() == 3) {
      const testing::PeerConnection connection =
          Check(testing::ParseConnection(absl::StrCat(words[1], " ", words[2])));
      const std::string address =
          Check(testing::ReceiveFrame(testing::kControlFd, absl::Minutes(1)));
      Check(receiver->Connect(address, connection.id, connection.key));
      Check(testing::SendFrame(testing::kControlFd, "ok"));
    } else {
      uint64_t number = 0;
      if (words.size() != 2 || !absl::SimpleAtoi(words[1], &number)) return 0;
      std::vector<uint64_t> latencies;
      for (uint64_t i = 0; i < number; ++i) {
        transport::ReceivedSlot slot = Check(receiver->Next(absl::Seconds(30)));
        const uint64_t now = NowNanos();
        uint64_t stamp = 0;
        std::memcpy(&stamp, slot.inline_metadata.data(), sizeof(stamp));
        latencies.push_back(now - stamp);
        Check(receiver->Release(slot.lease));
      }
      Check(testing::SendFrame(testing::kControlFd,
                               absl::string_view(reinterpret_cast<const char*>(latencies.data()),
                                                 latencies.size() * sizeof(uint64_t))));
    }
  }
}

struct Result {
  uint64_t bytes = 0;
  double gib_per_s = 0;
  double mapped_gib_per_s = -1;  // < 0: not available
  double memcpy_gib_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
};

double GiBPerSecond(uint64_t bytes, uint64_t nanos) {
  return static_cast<double>(bytes) / (1ull << 30) / (static_cast<double>(nanos) * 1e-9);
}

double MemcpyGiBPerSecond(uint64_t size, uint64_t count, uint32_t slots,
                          const std::vector<std::vector<uint8_t>>& sources) {
  std::vector<uint8_t> ring(size * slots, 1);  // touched, like the real ring
  const uint64_t start = NowNanos();
  for (uint64_t i = 0; i < count; ++i) {
    std::memcpy(ring.data() + (i % slots) * size, sources[i % sources.size()].data(), size);
  }
  const uint64_t elapsed = NowNanos() - start;
  volatile uint8_t sink = ring[(count - 1) % slots * size];  // keep the copies
  (void)sink;
  return GiBPerSecond(size * count, elapsed);
}

// The device baseline: what one cudaMemcpy host→device of the same sizes
// moves, from the same sources (page-locked for the staged ring, whose
// copies are from page-locked memory).
double CudaCopyGiBPerSecond(uint64_t size, uint64_t count, uint32_t slots,
                            std::vector<std::vector<uint8_t>>& sources, bool page_locked) {
  transport::CudaDeviceBuffer ring = Check(transport::CudaDeviceBuffer::Allocate(0, size * slots));
  std::vector<transport::CudaHostRegistration> locks;
  if (page_locked) {
    for (std::vector<uint8_t>& source : sources) {
      locks.push_back(Check(transport::CudaHostRegistration::Register(source.data(), size)));
    }
  }
  const uint64_t start = NowNanos();
  for (uint64_t i = 0; i < count; ++i) {
    Check(transport::CudaCopy(static_cast<uint8_t*>(ring.data()) + (i % slots) * size,
                              sources[i % sources.size()].data(), size));
  }
  return GiBPerSecond(size * count, NowNanos() - start);
}

class Bench {
 public:
  Bench(const Flags& flags, ChildProcess& child, Sender& sender, uint64_t connection_id)
      : flags_(flags), child_(child), sender_(sender), connection_id_(connection_id) {}

  // Throughput figures are medians over `rounds` rounds, each measuring
  // memcpy, put and in-place back to back, so that a noisy neighbour moves
  // all three alike.
  Result Measure(uint64_t size, uint64_t count, uint64_t latency_count, int rounds) {
    std::vector<std::vector<uint8_t>> sources(flags_.slots, std::vector<uint8_t>(size, 0x5a));
    const bool mapped = Check(sender_.Stats(connection_id_)).mapped;
    std::vector<double> memcpy_rates, put_rates, mapped_rates;
    for (int round = 0; round < rounds; ++round) {
      memcpy_rates.push_back(
          flags_.device() ? CudaCopyGiBPerSecond(size, count, flags_.slots, sources,
                                                 flags_.ring == "staged" || flags_.ring == "daemon")
                          : MemcpyGiBPerSecond(size, count, flags_.slots, sources));
      put_rates.push_back(Throughput(sources, count, /*in_place=*/false));
      if (mapped) mapped_rates.push_back(Throughput(sources, count, /*in_place=*/true));
    }
    Result result;
    result.bytes = size;
    result.memcpy_gib_per_s = Median(memcpy_rates);
    result.gib_per_s = Median(put_rates);
    if (mapped) result.mapped_gib_per_s = Median(mapped_rates);

    Start(latency_count);
    for (uint64_t i = 0; i < latency_count; ++i) Push(sources[0], /*window=*/1);
    DrainCredits();
    std::vector<uint64_t> latencies = Finish();
    std::sort(latencies.begin(), latencies.end());
    result.p50_us = latencies[latencies.size() / 2] * 1e-3;
    result.p99_us = latencies[std::min(latencies.size() - 1, latencies.size() * 99 / 100)] * 1e-3;
    return result;
  }

 private:
  static double Median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  }

  double Throughput(const std::vector<std::vector<uint8_t>>& sources, uint64_t count,
                    bool in_place) {
    Start(count);
    const uint64_t start = NowNanos();
    for (uint64_t i = 0; i < count; ++i) {
      const std::vector<uint8_t>& source = sources[i % sources.size()];
      in_place ? PushInPlace(source) : Push(source, /*window=*/0);
    }
    DrainCredits();
    const double rate = GiBPerSecond(sources[0].size() * count, NowNanos() - start);
    Finish();
    return rate;
  }

  static std::string Stamp() {
    const uint64_t now = NowNanos();
    return std::string(reinterpret_cast<const char*>(&now), sizeof(now));
  }

  void Start(uint64_t count) { Check(child_.Send(absl::StrCat("run ", count))); }
  std::vector<uint64_t> Finish() {
    const std::string frame = Check(child_.Receive());
    std::vector<uint64_t> latencies(frame.size() / sizeof(uint64_t));
    std::memcpy(latencies.data(), frame.data(), latencies.size() * sizeof(uint64_t));
    return latencies;
  }

  // Waits until at least one slot is free, or (window > 0) until no more than
  // window - 1 slots are in flight.
  void WaitForCredit(uint32_t window) {
    const uint32_t needed = window == 0 ? 1 : flags_.slots - window + 1;
    while (Check(sender_.Credits(connection_id_)) < needed)
      sender_.ProgressOrWait(absl::Milliseconds(10));
  }
  void DrainCredits() { WaitForCredit(1); }

  void Push(const std::vector<uint8_t>& source, uint32_t window) {
    WaitForCredit(window);
    transport::SlotContent content;
    content.fields.push_back(
        {{"payload", ElementType::kUInt8, {static_cast<int64_t>(source.size())}}, source.data()});
    content.inline_metadata = Stamp();
    Check(sender_.Push(connection_id_, content));
  }

  void PushInPlace(const std::vector<uint8_t>& source) {
    WaitForCredit(0);
    transport::MappedSlot slot = Check(sender_.MapNextSlot(connection_id_));
    transport::SlotContent content;
    content.inline_metadata = Stamp();
    std::memcpy(slot.data, source.data(), source.size());
    content.fields.push_back(
        {{"payload", ElementType::kUInt8, {static_cast<int64_t>(source.size())}}, nullptr});
    Check(sender_.CommitMapped(connection_id_, content));
  }

  const Flags& flags_;
  ChildProcess& child_;
  Sender& sender_;
  const uint64_t connection_id_;
};

int RunSender(const Flags& flags, const std::string& self) {
  // A shared ring's descriptor comes over a Unix socket (world-writable for
  // a receiver of another uid), as a client hands it to its daemon.
  const std::string socket_path = absl::StrCat("/tmp/pf-transport-bench-", getpid(), ".sock");
  ScopedFd listening;
  if (flags.by_descriptor()) {
    listening = ScopedFd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const sockaddr_un address = UnixAddress(socket_path);
    unlink(socket_path.c_str());
    if (bind(listening.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
        chmod(socket_path.c_str(), 0666) != 0 || listen(listening.get(), 1) != 0) {
      Die(ErrnoToStatus(errno, "bind", socket_path));
    }
  }
  // A trainer in a container: its pids mean nothing to the sender, which
  // must not need them (descriptors pass over the socket, no ptrace).
  std::vector<std::string> argv = {self,
                                   "--role",
                                   "receiver",
                                   "--tls",
                                   flags.transports,
                                   "--slots",
                                   absl::StrCat(flags.slots),
                                   "--spin-us",
                                   absl::StrCat(flags.spin_us),
                                   "--ring",
                                   flags.ring,
                                   "--receiver-uid",
                                   absl::StrCat(flags.receiver_uid),
                                   "--ring-socket",
                                   socket_path};
  if (flags.receiver_pid_namespace) {
    // With a /proc of its own, as a container has: under the outer /proc,
    // CUDA refuses to start in the namespace (cudaGetDeviceCount: error 304).
    argv.insert(argv.begin(),
                {"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--"});
  }
  ChildProcess child = Check(ChildProcess::Spawn(argv));
  transport::SenderOptions options;
  options.ucx.transports = flags.transports;
  options.spin = absl::Microseconds(flags.spin_us);
  std::unique_ptr<Sender> sender = Check(Sender::Create(options));
  const std::string address = Check(child.Receive());
  const std::string ring = Check(child.Receive());
  uint64_t connection_id = 0;
  if (flags.by_descriptor()) {
    ScopedFd peer(accept4(listening.get(), nullptr, nullptr, SOCK_CLOEXEC));
    unlink(socket_path.c_str());
    auto [message, fd] = Check(transport::ReceiveWithFd(peer.get()));
    const transport::RingOffer offer = Check(transport::ParseRingOffer(message));
    auto shared = std::make_shared<transport::SharedRing>(
        offer.device()
            ? Check(transport::SharedRing::ImportDevice(std::move(fd), offer.bytes, offer.gpu_uuid))
            : Check(transport::SharedRing::Map(std::move(fd), offer.bytes)));
    connection_id = Check(sender->ConnectShared(address, ring, std::move(shared)));
  } else {
    connection_id = Check(sender->Connect(address, ring));
  }
  Check(child.Send(absl::StrCat(
      "connect ", testing::FormatConnection(connection_id, Check(sender->Key(connection_id))))));
  Check(child.Send(sender->worker_address()));
  if (Check(child.Receive()) != "ok") Die(absl::InternalError("receiver did not connect"));

  Bench bench(flags, child, *sender, connection_id);
  bench.Measure(kMaxSlot, flags.slots, 1, 1);  // warm-up: the sender maps every page once
  const transport::ConnectionStats stats = Check(sender->Stats(connection_id));
  if (!flags.json) {
    printf("transport_bench: UCX %s, UCX_TLS=%s, %u slots, %s ring %s, receiver uid %d%s\n",
           transport::UcpContext::LibraryVersion().c_str(), flags.transports.c_str(), flags.slots,
           flags.ring.c_str(), stats.mapped ? "mapped into the sender" : "not mapped",
           flags.receiver_uid >= 0 ? flags.receiver_uid : static_cast<int>(getuid()),
           flags.receiver_pid_namespace ? " in a PID namespace of its own" : "");
    printf("%10s %12s %14s %13s %7s %9s %9s\n", "slot", "put GiB/s", "in-place GiB/s",
           flags.ring == "staged" ? "pinned H2D"
           : flags.device()       ? "H2D cpy GiB/s"
                                  : "memcpy GiB/s",
           "ratio", "p50 us", "p99 us");
  }
  // Short measurements, many rounds: this kind of machine throttles sustained
  // copies after a few milliseconds (memcpy of an L2-resident 64 KiB falls
  // from ~25 to ~6 GiB/s), so long runs measure the throttle, not the code.
  const uint64_t divisor = flags.quick ? 4 : 1;
  const int rounds = flags.quick ? 3 : 9;
  struct Size {
    uint64_t bytes, count, latency_count;
    const char* name;
  };
  for (const Size& size : {Size{64 << 10, 1024, 2000, "64 KiB"}, Size{1 << 20, 128, 500, "1 MiB"},
                           Size{16 << 20, 16, 50, "16 MiB"}, Size{64 << 20, 8, 20, "64 MiB"}}) {
    const Result r = bench.Measure(size.bytes, std::max<uint64_t>(4, size.count / divisor),
                                   std::max<uint64_t>(4, size.latency_count / divisor), rounds);
    const double ratio = r.gib_per_s / r.memcpy_gib_per_s;
    if (flags.json) {
      printf(
          "{\"bytes\": %lu, \"gib_per_s\": %.3f, \"mapped_gib_per_s\": %.3f, "
          "\"memcpy_gib_per_s\": %.3f, \"ratio\": %.3f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
          "\"transports\": \"%s\"}\n",
          r.bytes, r.gib_per_s, r.mapped_gib_per_s, r.memcpy_gib_per_s, ratio, r.p50_us, r.p99_us,
          flags.transports.c_str());
    } else {
      printf(
          "%10s %12.2f %14s %13.2f %7.2f %9.1f %9.1f\n", size.name, r.gib_per_s,
          r.mapped_gib_per_s < 0 ? "-" : absl::StrCat(absl::SixDigits(r.mapped_gib_per_s)).c_str(),
          r.memcpy_gib_per_s, ratio, r.p50_us, r.p99_us);
    }
  }
  Check(sender->Disconnect(connection_id));
  child.Kill(SIGTERM);
  return 0;
}

}  // namespace
}  // namespace packfeed

int main(int argc, char** argv) {
  packfeed::Flags flags;
  CLI::App app{"packfeed transport benchmark (two processes on this machine)"};
  app.add_option("--role", flags.role, "internal: sender (default) or receiver");
  app.add_option("--tls", flags.transports, "UCX transports, as UCX_TLS spells them");
  app.add_option("--slots", flags.slots, "ring slots (credits)");
  app.add_option("--spin-us", flags.spin_us, "polling before sleeping, both sides");
  app.add_option("--ring", flags.ring,
                 "where the receiver's ring lives: host, shared (host, a memfd handed over a "
                 "Unix socket), device (CUDA, written by UCX), staged (host, copied to the "
                 "device on arrival) or daemon (CUDA memory shared by descriptor, copied in by "
                 "the sender)")
      ->check(CLI::IsMember({"host", "shared", "device", "staged", "daemon"}));
  app.add_option("--receiver-uid", flags.receiver_uid,
                 "run the receiver as this uid (from root; with --ring shared and --tls tcp,self)");
  app.add_flag("--receiver-pid-namespace", flags.receiver_pid_namespace,
               "run the receiver in a PID namespace of its own (from root; unshare)");
  app.add_option("--ring-socket", flags.ring_socket, "internal");
  app.add_flag("--json", flags.json, "one JSON object per slot size");
  app.add_flag("--quick", flags.quick, "1/16 of the messages (a smoke run)");
  CLI11_PARSE(app, argc, argv);
  if (flags.role == "receiver") return packfeed::RunReceiver(flags);
  // The path itself: under unshare, /proc/self/exe would be unshare.
  return packfeed::RunSender(flags, std::filesystem::read_symlink("/proc/self/exe").string());
}
