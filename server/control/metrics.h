#ifndef PACKFEED_SERVER_CONTROL_METRICS_H_
#define PACKFEED_SERVER_CONTROL_METRICS_H_

// The daemon's figures for Prometheus: the text exposition format (0.0.4) of
// every job's, local rank's and dataset file's stats, served on GET /metrics when the
// configuration names a metrics_address. Off by default.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "packfeed/v1/service.pb.h"

struct MHD_Daemon;

namespace packfeed::server {

// Every figure of `stats` as Prometheus metrics, labelled packfeed_job (and
// rank), or path for a dataset file: "job" is the label Prometheus itself
// gives each scrape target. Pure; jobs, ranks and files in the order given.
std::string RenderMetrics(const v1::GetStatsReply& stats);

// An HTTP listener (libmicrohttpd, its own thread) that answers GET /metrics
// with RenderMetrics(collect()) and anything else with 404. `collect` runs
// on the listener's thread for each scrape. Thread-safe.
class MetricsServer {
 public:
  using Collect = std::function<absl::StatusOr<v1::GetStatsReply>()>;
  // `address` is "host:port" (IPv4 host or name); port 0 picks a free one.
  // Unavailable naming the address when it cannot be listened on.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              Collect collect);
  ~MetricsServer();  // Stops listening; a scrape in progress completes first.
  int port() const { return port_; }

 private:
  friend struct MetricsRequest;  // libmicrohttpd's callback (metrics.cc)
  explicit MetricsServer(Collect collect) : collect_(std::move(collect)) {}

  const Collect collect_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_METRICS_H_
