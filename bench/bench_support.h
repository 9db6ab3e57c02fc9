#ifndef PACKFEED_BENCH_BENCH_SUPPORT_H_
#define PACKFEED_BENCH_BENCH_SUPPORT_H_

// What the benches that start a packfeedd of their own share.

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "packfeed/client/client.h"

namespace packfeed::bench {

// A "Name:   N kB" line of /proc/PID/status, KiB; 0 when unreadable.
inline uint64_t StatusKib(pid_t pid, const std::string& name) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(name + ":", 0) == 0) return std::stoull(line.substr(name.size() + 1));
  }
  return 0;
}

// The process's peak resident set (VmHWM), KiB.
inline uint64_t PeakRssKib(pid_t pid) { return StatusKib(pid, "VmHWM"); }

// The process's user + system CPU time so far, seconds; 0 when unreadable.
inline double CpuSeconds(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return 0;
  // Fields after the command (which may hold spaces) start past its ')'.
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
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
