// packfeedd: one per node. Serves the jobs of a configuration file until
// SIGTERM/SIGINT or an admin Drain, then says goodbye to every rank and exits.
//
//   packfeedd --config /etc/packfeed/packfeedd.textproto [--ucx-tls sm,self]

#include <malloc.h>
#include <signal.h>

#include <thread>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "packfeed/common/mutex_mode.h"
#include "packfeed/common/version.h"
#include "server/config/daemon_config.h"
#include "server/control/daemon.h"
#include "server/daemon/systemd_notifier.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  CLI::App app{"packfeedd: the per-node packfeed data daemon"};
  std::string config_path;
  std::string socket_path;
  std::string ucx_tls;
  std::string log_level = "info";
  app.set_version_flag("--version", packfeed::kPackfeedVersion);
  app.add_option("--config", config_path, "configuration file (protobuf text format)")->required();
  app.add_option("--socket", socket_path, "override the configuration's socket_path");
  app.add_option("--ucx-tls", ucx_tls, "UCX transports, as UCX_TLS spells them (default: UCX's)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error");
  CLI11_PARSE(app, argc, argv);

  packfeed::UseReleaseMutexChecks();
  // Read buffers (up to max_request_bytes) and side rows (megabytes per
  // microbatch) are allocated on the storage's eight threads and freed on
  // the runner's. With an arena per thread, each arena keeps the pages of
  // its own peak, and the daemon's private memory settles at several times
  // what it holds (e2e_bench with a 48x8 side field: 92-97 MiB peak against
  // 59-76 with two arenas, same tokens/s). A fixed mmap threshold gives the
  // pages back as well, but faults them in again on every read (0.6-0.8x
  // the tokens/s).
  mallopt(M_ARENA_MAX, 2);
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("packfeedd [%l] %v");
  // Every line reaches the journal (or a log file) when it is written: stdout
  // to a pipe or file is otherwise block-buffered.
  spdlog::flush_on(spdlog::level::trace);

  absl::StatusOr<packfeed::v1::DaemonConfig> config =
      packfeed::server::LoadDaemonConfig(config_path);
  if (!config.ok()) {
    spdlog::error("invalid configuration: {}", config.status().ToString());
    return 2;
  }
  if (!socket_path.empty()) config->set_socket_path(socket_path);

  // A write into a pipe or socket whose reader has gone (a log piped into
  // a program that exited, a peer that died) fails with EPIPE where it is
  // made; it must not kill the daemon and every rank it serves.
  signal(SIGPIPE, SIG_IGN);

  // Signals are taken by one thread with sigwait: every thread started from
  // here on inherits the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The signal thread runs from here on, so a SIGTERM during start-up (a
  // peer that never answers, a long index build) stops the daemon too.
  absl::Mutex mutex;
  absl::Notification stop;
  packfeed::server::Daemon* running = nullptr;  // guarded by mutex
  bool exiting = false;                         // guarded by mutex
  std::thread signal_thread([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    absl::MutexLock lock(&mutex);
    if (exiting) return;  // main's own SIGTERM, sent to end this wait
    spdlog::info("signal {}: {}", signal, running != nullptr ? "draining" : "stopping start-up");
    stop.Notify();
    if (running != nullptr) running->Shutdown();
  });
  const auto release_signal_thread = [&] {
    {
      absl::MutexLock lock(&mutex);
      exiting = true;
    }
    kill(getpid(), SIGTERM);
    signal_thread.join();
  };

  packfeed::server::DaemonOptions options;
  options.ucx_transports = ucx_tls;
  options.on_peer_wait = packfeed::server::NotifyStillStarting;
  options.stop = &stop;
  absl::StatusOr<std::unique_ptr<packfeed::server::Daemon>> daemon =
      packfeed::server::Daemon::Start(*config, options);
  if (!daemon.ok()) {
    release_signal_thread();
    if (absl::IsCancelled(daemon.status()) && stop.HasBeenNotified()) {
      spdlog::info("stopped during start-up: {}", std::string(daemon.status().message()));
      return 0;
    }
    spdlog::error("cannot start: {}", daemon.status().ToString());
    return 1;
  }
  packfeed::server::SystemdNotifier systemd(**daemon);
  {
    absl::MutexLock lock(&mutex);
    running = daemon->get();
    // A signal that came as Start returned: drain at once.
    if (stop.HasBeenNotified()) running->Shutdown();
  }
  // Daemon::Start returned: the socket answers.
  systemd.Ready(config->jobs_size());
  spdlog::info("ready");
  (*daemon)->Wait();
  systemd.Stopping();
  // A Drain ended the wait: release the signal thread the same way.
  release_signal_thread();
  daemon->reset();
  spdlog::info("stopped");
  return 0;
}
