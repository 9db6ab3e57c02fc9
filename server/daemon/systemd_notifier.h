#ifndef PACKFEED_SERVER_DAEMON_SYSTEMD_NOTIFIER_H_
#define PACKFEED_SERVER_DAEMON_SYSTEMD_NOTIFIER_H_

// packfeedd under systemd (Type=notify): while start-up waits for peer
// daemons, EXTEND_TIMEOUT_USEC with a STATUS naming the peer (the unit's
// start timeout would otherwise end a wait longer than it); READY=1 once the
// socket serves,
// WATCHDOG=1 while every job's runner is going round its loop, STOPPING=1 on
// the way out. Outside systemd (no NOTIFY_SOCKET) every call does nothing.

#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/control/daemon.h"

namespace packfeed::server {

// Extends systemd's start timeout by kStartExtension from now and sets the
// unit's status line. Cheap: call it every few seconds while starting.
void NotifyStillStarting(const std::string& status);
inline constexpr absl::Duration kStartExtension = absl::Seconds(15);

class SystemdNotifier {
 public:
  // REQUIRES: `daemon` outlives the notifier.
  explicit SystemdNotifier(const Daemon& daemon);
  ~SystemdNotifier();  // Stops the watchdog thread.

  void Ready(int jobs);
  void Stopping();

 private:
  void FeedWatchdog(absl::Duration interval);

  const Daemon& daemon_;
  absl::Notification stop_;
  std::thread watchdog_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_DAEMON_SYSTEMD_NOTIFIER_H_
