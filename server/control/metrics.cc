#include "server/control/metrics.h"

#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

// One metric family: its HELP and TYPE lines, then its samples.
class Family {
 public:
  Family(std::string* out, absl::string_view name, absl::string_view type, absl::string_view help)
      : out_(out), name_(name) {
    absl::StrAppend(out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  void Sample(absl::string_view labels, double value) {
    // The shortest text that reads back as the same double: StrAppend's six
    // digits would turn a byte counter of 12 345 678 901 into 1.23457e+10.
    char text[32];
    const auto written = std::to_chars(text, text + sizeof(text), value);
    const absl::string_view figure(text, static_cast<size_t>(written.ptr - text));
    if (labels.empty()) {
      absl::StrAppend(out_, name_, " ", figure, "\n");
    } else {
      absl::StrAppend(out_, name_, "{", labels, "} ", figure, "\n");
    }
  }

 private:
  std::string* out_;
  std::string name_;
};

// A label value as the exposition format quotes it.
std::string Quoted(absl::string_view value) {
  return absl::StrCat(
      "\"", absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}}), "\"");
}

std::string JobLabel(const v1::JobStats& job) { return "packfeed_job=" + Quoted(job.name()); }

std::string RankLabels(const v1::JobStats& job, const v1::RankStats& rank) {
  return absl::StrCat(JobLabel(job), ",rank=\"", rank.global_rank(), "\"");
}

void RenderStorage(const v1::StorageStats& storage, std::string* out) {
  struct FileFigure {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const v1::StorageFileStats&);
  };
  const FileFigure file_figures[] = {
      {"packfeed_file_read_bytes_total", "counter", "Bytes requested from the OS (every pread).",
       [](const v1::StorageFileStats& f) { return static_cast<double>(f.bytes_read()); }},
      {"packfeed_file_reads_total", "counter", "Read requests issued.",
       [](const v1::StorageFileStats& f) { return static_cast<double>(f.reads()); }},
      {"packfeed_file_distinct_bytes_total", "counter",
       "Bytes of the distinct (document, epoch)s the node's ranks needed.",
       [](const v1::StorageFileStats& f) { return static_cast<double>(f.distinct_bytes()); }},
      {"packfeed_file_reread_bytes_total", "counter", "Bytes read again.",
       [](const v1::StorageFileStats& f) { return static_cast<double>(f.reread_bytes()); }},
      {"packfeed_file_io_amplification", "gauge", "Bytes read over distinct bytes (1 is ideal).",
       [](const v1::StorageFileStats& f) { return f.io_amplification(); }},
  };
  for (const FileFigure& figure : file_figures) {
    Family family(out, figure.name, figure.type, figure.help);
    for (const v1::StorageFileStats& file : storage.files()) {
      family.Sample("path=" + Quoted(file.path()), figure.value(file));
    }
  }
  {
    Family family(out, "packfeed_file_read_latency_seconds", "gauge",
                  "Read latency quantiles over the latest 4096 reads.");
    for (const v1::StorageFileStats& file : storage.files()) {
      const std::string path = "path=" + Quoted(file.path());
      family.Sample(path + ",quantile=\"0.5\"", file.read_latency_p50_ms() / 1e3);
      family.Sample(path + ",quantile=\"0.99\"", file.read_latency_p99_ms() / 1e3);
      family.Sample(path + ",quantile=\"1\"", file.read_latency_max_ms() / 1e3);
    }
  }
  const std::pair<const char*, double> node[] = {
      {"packfeed_storage_bytes_in_flight", static_cast<double>(storage.bytes_in_flight())},
      {"packfeed_storage_bytes_held", static_cast<double>(storage.bytes_held())},
      {"packfeed_storage_bytes_kept", static_cast<double>(storage.bytes_kept())},
      {"packfeed_storage_memory_budget_bytes", static_cast<double>(storage.memory_budget_bytes())},
  };
  for (const auto& [name, value] : node) {
    Family family(out, name, "gauge", "The node's storage (docs/DAEMON.md).");
    family.Sample("", value);
  }
  Family rereads(out, "packfeed_storage_reread_events_total", "counter",
                 "Fetches that read something the node had read before.");
  rereads.Sample("", static_cast<double>(storage.reread_events()));
}

using Jobs = google::protobuf::RepeatedPtrField<v1::JobStats>;

void RenderJobs(const Jobs& jobs, std::string* out) {
  struct JobFigure {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const v1::JobStats&);
  };
  const JobFigure job_figures[] = {
      {"packfeed_job_steps_planned_total", "counter", "Steps planned and read ahead.",
       [](const v1::JobStats& j) { return static_cast<double>(j.steps_planned()); }},
      {"packfeed_job_steps_served", "gauge", "Steps every local rank has been sent.",
       [](const v1::JobStats& j) { return static_cast<double>(j.steps_served()); }},
      {"packfeed_job_read_bytes_total", "counter",
       "Bytes this job's fetches read from the dataset files.",
       [](const v1::JobStats& j) { return static_cast<double>(j.bytes_read()); }},
      {"packfeed_job_needed_bytes_total", "counter",
       "Bytes of the distinct samples the local ranks needed first.",
       [](const v1::JobStats& j) { return static_cast<double>(j.unique_bytes_needed()); }},
      {"packfeed_job_io_amplification", "gauge", "Bytes read over bytes needed (1 is ideal).",
       [](const v1::JobStats& j) { return j.io_amplification(); }},
      {"packfeed_job_cached_bytes", "gauge", "Bytes of samples held for the steps ahead.",
       [](const v1::JobStats& j) { return static_cast<double>(j.cached_bytes()); }},
      {"packfeed_job_side_rows_bytes", "gauge",
       "Bytes of side-field rows held for the microbatches being sent or read ahead.",
       [](const v1::JobStats& j) { return static_cast<double>(j.side_rows_bytes()); }},
      {"packfeed_job_plan_seconds_total", "counter", "Time spent planning steps.",
       [](const v1::JobStats& j) { return j.plan_seconds(); }},
      {"packfeed_job_read_seconds_total", "counter",
       "Time from each step's fetch to its samples held.",
       [](const v1::JobStats& j) { return j.read_seconds(); }},
      {"packfeed_job_step_over_ideal", "gauge",
       "Mean modelled step time over perfect balance of the steps planned (s^2/c).",
       [](const v1::JobStats& j) { return j.mean_step_over_ideal(); }},
      {"packfeed_job_slowest_rank_steps_behind", "gauge",
       "Steps between the local ranks that consumed most and least.",
       [](const v1::JobStats& j) { return static_cast<double>(j.slowest_rank_steps_behind()); }},
      {"packfeed_job_wait_seconds_total", "counter",
       "Time the job's local trainers spent blocked waiting for data, summed over ranks.",
       [](const v1::JobStats& j) { return j.wait_seconds(); }},
      {"packfeed_job_input_bound", "gauge",
       "The largest share of step time a local rank's trainer spent waiting for data.",
       [](const v1::JobStats& j) { return j.input_bound(); }},
  };
  for (const JobFigure& figure : job_figures) {
    Family family(out, figure.name, figure.type, figure.help);
    for (const v1::JobStats& job : jobs) family.Sample(JobLabel(job), figure.value(job));
  }
}

void RenderRanks(const Jobs& jobs, std::string* out) {
  struct RankFigure {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const v1::RankStats&, int64_t most_consumed);
  };
  const RankFigure rank_figures[] = {
      {"packfeed_rank_attached", "gauge", "1 while the rank is attached.",
       [](const v1::RankStats& r, int64_t) { return r.attached() ? 1.0 : 0.0; }},
      {"packfeed_rank_slots_pushed_total", "counter", "Microbatches pushed to the rank.",
       [](const v1::RankStats& r, int64_t) { return static_cast<double>(r.slots_pushed()); }},
      {"packfeed_rank_slots_released_total", "counter", "Microbatches the rank released.",
       [](const v1::RankStats& r, int64_t) { return static_cast<double>(r.slots_released()); }},
      {"packfeed_rank_sent_bytes_total", "counter", "Bytes pushed to the rank.",
       [](const v1::RankStats& r, int64_t) { return static_cast<double>(r.bytes_sent()); }},
      {"packfeed_rank_slots_in_flight", "gauge", "Microbatches pushed and not yet released.",
       [](const v1::RankStats& r, int64_t) { return static_cast<double>(r.slots_in_flight()); }},
      {"packfeed_rank_consumed_step", "gauge", "The step of the next microbatch to consume.",
       [](const v1::RankStats& r, int64_t) { return static_cast<double>(r.consumed_step()); }},
      {"packfeed_rank_wait_seconds_total", "counter",
       "Time the rank's trainer spent blocked in NextStep/Next waiting for data.",
       [](const v1::RankStats& r, int64_t) { return r.wait_seconds(); }},
      {"packfeed_rank_busy_seconds_total", "counter",
       "Time the rank's trainer spent between its calls for data (its own work).",
       [](const v1::RankStats& r, int64_t) { return r.busy_seconds(); }},
      {"packfeed_rank_copied_out_total", "counter",
       "Microbatches the rank's client handed out as private copies, its trainer holding "
       "every ring slot but one.",
       [](const v1::RankStats& r, int64_t) { return static_cast<double>(r.copied_out()); }},
      {"packfeed_rank_input_bound", "gauge",
       "The share of the rank's step time its trainer spent waiting for data.",
       [](const v1::RankStats& r, int64_t) { return r.input_bound(); }},
      {"packfeed_rank_steps_behind", "gauge",
       "Steps the rank has consumed fewer than the job's most advanced local rank.",
       [](const v1::RankStats& r, int64_t most) {
         return static_cast<double>(most - r.consumed_step());
       }},
  };
  for (const RankFigure& figure : rank_figures) {
    Family family(out, figure.name, figure.type, figure.help);
    for (const v1::JobStats& job : jobs) {
      int64_t most = 0;
      for (const v1::RankStats& rank : job.ranks()) most = std::max(most, rank.consumed_step());
      for (const v1::RankStats& rank : job.ranks()) {
        family.Sample(RankLabels(job, rank), figure.value(rank, most));
      }
    }
  }
}

// The cost model fitted from measured compute, rate by rate.
void RenderCostFits(const Jobs& jobs, std::string* out) {
  struct RateFigure {
    const char* name;
    const char* help;
    double (*value)(const v1::CostRate&);
  };
  const RateFigure rate_figures[] = {
      {"packfeed_cost_fit_rate", "A rate of the cost model fitted from measured compute.",
       [](const v1::CostRate& r) { return r.fitted(); }},
      {"packfeed_cost_fit_stddev", "The fitted rate's posterior standard deviation.",
       [](const v1::CostRate& r) { return r.stddev(); }},
      {"packfeed_cost_fit_determined",
       "The share of the prior's variance the measurements removed (1 = data alone).",
       [](const v1::CostRate& r) { return r.determined(); }},
  };
  for (const RateFigure& figure : rate_figures) {
    Family family(out, figure.name, "gauge", figure.help);
    for (const v1::JobStats& job : jobs) {
      for (const v1::CostRate& rate : job.cost_fit().rates()) {
        family.Sample(JobLabel(job) + ",rate=" + Quoted(rate.name()), figure.value(rate));
      }
    }
  }
  Family rows(out, "packfeed_cost_fit_rows", "gauge", "Measured microbatches in the cost fit.");
  for (const v1::JobStats& job : jobs) {
    rows.Sample(JobLabel(job), static_cast<double>(job.cost_fit().rows()));
  }
  // Every node of a job should show the same version: one behind, or with
  // versions missed, plans some steps by an older model than the others.
  Family version(out, "packfeed_cost_model_version", "gauge",
                 "The learned cost model's latest version this node holds (0 = configured).");
  for (const v1::JobStats& job : jobs) {
    version.Sample(JobLabel(job), job.cost_fit().model_version());
  }
  Family missed(out, "packfeed_cost_model_versions_missed_total", "counter",
                "Learned versions announced after this node had planned their first step.");
  for (const v1::JobStats& job : jobs) {
    missed.Sample(JobLabel(job), static_cast<double>(job.cost_fit().model_versions_missed()));
  }
}

}  // namespace

std::string RenderMetrics(const v1::GetStatsReply& stats) {
  std::string out;
  RenderJobs(stats.jobs(), &out);
  RenderRanks(stats.jobs(), &out);
  RenderCostFits(stats.jobs(), &out);
  RenderStorage(stats.storage(), &out);
  return out;
}

// libmicrohttpd's access handler, a friend of MetricsServer.
struct MetricsRequest {
  static MHD_Result Answer(void* self, MHD_Connection* connection, const char* url,
                           const char* method, const char* /*version*/, const char* /*upload_data*/,
                           size_t* /*upload_data_size*/, void** /*state*/) {
    auto* server = static_cast<MetricsServer*>(self);
    unsigned int code = MHD_HTTP_OK;
    std::string body;
    if (std::strcmp(method, "GET") != 0 || std::strcmp(url, "/metrics") != 0) {
      code = MHD_HTTP_NOT_FOUND;
      body = "packfeedd serves GET /metrics only\n";
    } else {
      absl::StatusOr<v1::GetStatsReply> stats = server->collect_();
      if (stats.ok()) {
        body = RenderMetrics(*stats);
      } else {
        code = MHD_HTTP_SERVICE_UNAVAILABLE;
        body = stats.status().ToString() + "\n";
      }
    }
    MHD_Response* response =
        MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
    if (response == nullptr) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8");
    const MHD_Result queued = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return queued;
  }
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    Collect collect) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address '", address, "': expected host:port"));
  }
  const std::string host = address.substr(0, colon);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address '", address, "': ", gai_strerror(error)));
  }
  sockaddr_in bind_to{};
  std::memcpy(&bind_to, found->ai_addr, sizeof(bind_to));
  freeaddrinfo(found);
  bind_to.sin_port = htons(static_cast<uint16_t>(port));

  std::unique_ptr<MetricsServer> server(new MetricsServer(std::move(collect)));
  server->daemon_ =
      MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, nullptr, nullptr,
                       &MetricsRequest::Answer, server.get(), MHD_OPTION_SOCK_ADDR, &bind_to,
                       MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on metrics_address ", address));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : port;
  return server;
}

MetricsServer::~MetricsServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace packfeed::server
