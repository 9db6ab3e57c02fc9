#include "server/daemon/systemd_notifier.h"

#include <systemd/sd-daemon.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

void NotifyStillStarting(const std::string& status) {
  const std::string message = absl::StrCat(
      "EXTEND_TIMEOUT_USEC=", absl::ToInt64Microseconds(kStartExtension), "\nSTATUS=", status);
  sd_notify(0, message.c_str());
}

SystemdNotifier::SystemdNotifier(const Daemon& daemon) : daemon_(daemon) {
  uint64_t usec = 0;
  // Keeps WATCHDOG_USEC in the environment for the threads that follow.
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0) {
    watchdog_ = std::thread(&SystemdNotifier::FeedWatchdog, this,
                            absl::Microseconds(static_cast<int64_t>(usec)));
  }
}

SystemdNotifier::~SystemdNotifier() {
  stop_.Notify();
  if (watchdog_.joinable()) watchdog_.join();
}

void SystemdNotifier::Ready(int jobs) {
  const std::string status =
      absl::StrCat("READY=1\nSTATUS=serving ", jobs, " job(s) on ", daemon_.config().socket_path());
  if (sd_notify(0, status.c_str()) < 0) spdlog::warn("sd_notify(READY=1) failed");
}

void SystemdNotifier::Stopping() { sd_notify(0, "STOPPING=1\nSTATUS=draining"); }

void SystemdNotifier::FeedWatchdog(absl::Duration interval) {
  // Pinged twice per interval; a runner stuck for a whole interval stops the
  // pings and systemd restarts the daemon (Restart=on-failure).
  const absl::Duration period = interval / 2;
  bool warned = false;
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    if (daemon_.Healthy(interval)) {
      sd_notify(0, "WATCHDOG=1");
      warned = false;
    } else if (!warned) {
      spdlog::error("a job runner has not gone round its loop for {}: watchdog not fed",
                    absl::FormatDuration(interval));
      warned = true;
    }
  }
}

}  // namespace packfeed::server
