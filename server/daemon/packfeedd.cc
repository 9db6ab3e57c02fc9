// packfeedd: one per node. Serves the jobs of a configuration file until
// SIGTERM/SIGINT or an admin Drain, then says goodbye to every rank and exits.
//
//   packfeedd --config /etc/packfeed/packfeedd.textproto [--ucx-tls sm,self]

#include <signal.h>

#include <thread>

#include "CLI/CLI.hpp"
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

  packfeed::server::DaemonOptions options;
  options.ucx_transports = ucx_tls;
  options.on_peer_wait = packfeed::server::NotifyStillStarting;
  absl::StatusOr<std::unique_ptr<packfeed::server::Daemon>> daemon =
      packfeed::server::Daemon::Start(*config, options);
  if (!daemon.ok()) {
    spdlog::error("cannot start: {}", daemon.status().ToString());
    return 1;
  }
  packfeed::server::SystemdNotifier systemd(**daemon);
  std::thread signal_thread([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    spdlog::info("signal {}: draining", signal);
    (*daemon)->Shutdown();
  });
  // Daemon::Start returned: the socket answers.
  systemd.Ready(config->jobs_size());
  spdlog::info("ready");
  (*daemon)->Wait();
  systemd.Stopping();
  // A Drain ended the wait: release the signal thread the same way.
  kill(getpid(), SIGTERM);
  signal_thread.join();
  daemon->reset();
  spdlog::info("stopped");
  return 0;
}
