#ifndef PACKFEED_BENCH_BENCH_SUPPORT_H_
#define PACKFEED_BENCH_BENCH_SUPPORT_H_

// What the benches that start a packfeedd of their own share.

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "packfeed/client/client.h"

namespace packfeed::bench {

// The process's peak resident set (VmHWM), KiB; 0 when unreadable.
inline uint64_t PeakRssKib(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// Attaches, polling every `interval` while the daemon is not up yet
// (Unavailable), for `timeout` at most.
inline absl::StatusOr<std::unique_ptr<client::Client>> AttachWithRetry(
    const client::ClientOptions& options, absl::Duration timeout,
    absl::Duration interval = absl::Milliseconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Attach(options);
    if (client.ok() || !absl::IsUnavailable(client.status()) || absl::Now() > deadline) {
      return client;
    }
    absl::SleepFor(interval);
  }
}

}  // namespace packfeed::bench

#endif  // PACKFEED_BENCH_BENCH_SUPPORT_H_
