// The Prometheus exposition of the daemon's stats, and its HTTP listener
// answering a real HTTP request over loopback.

#include "server/control/metrics.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;

v1::JobStats SomeJob() {
  v1::JobStats job;
  job.set_name("pre\"train");
  job.set_steps_planned(12);
  job.set_steps_served(10);
  job.set_bytes_read(4096);
  job.set_unique_bytes_needed(2048);
  job.set_io_amplification(2.0);
  job.set_mean_step_over_ideal(1.25);
  for (int r = 0; r < 2; ++r) {
    v1::RankStats* rank = job.add_ranks();
    rank->set_global_rank(r);
    rank->set_attached(r == 0);
    rank->set_slots_pushed(40 + r);
    rank->set_consumed_step(9 - 3 * r);
  }
  return job;
}

TEST(MetricsTest, RendersEveryFigureWithHelpTypeAndLabels) {
  v1::GetStatsReply stats;
  *stats.add_jobs() = SomeJob();
  v1::StorageFileStats* file = stats.mutable_storage()->add_files();
  file->set_path("/data/a.bin");
  file->set_bytes_read(300);
  file->set_read_latency_p99_ms(5);
  stats.mutable_storage()->set_bytes_in_flight(64);
  stats.mutable_storage()->set_bytes_held(uint64_t{12345678901});  // every digit exported
  const std::string text = RenderMetrics(stats);
  EXPECT_THAT(text, HasSubstr("\npackfeed_storage_bytes_held 12345678901\n"));
  EXPECT_THAT(text, HasSubstr("packfeed_file_read_bytes_total{path=\"/data/a.bin\"} 300\n"));
  EXPECT_THAT(text, HasSubstr("packfeed_file_read_latency_seconds{path=\"/data/a.bin\","
                              "quantile=\"0.99\"} 0.005\n"));
  EXPECT_THAT(text, HasSubstr("\npackfeed_storage_bytes_in_flight 64\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE packfeed_job_steps_planned_total counter\n"));
  EXPECT_THAT(text,
              HasSubstr("packfeed_job_steps_planned_total{packfeed_job=\"pre\\\"train\"} 12\n"));
  EXPECT_THAT(text, HasSubstr("packfeed_job_io_amplification{packfeed_job=\"pre\\\"train\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("packfeed_job_step_over_ideal{packfeed_job=\"pre\\\"train\"} 1.25\n"));
  EXPECT_THAT(text,
              HasSubstr("packfeed_rank_attached{packfeed_job=\"pre\\\"train\",rank=\"1\"} 0\n"));
  EXPECT_THAT(
      text,
      HasSubstr("packfeed_rank_slots_pushed_total{packfeed_job=\"pre\\\"train\",rank=\"1\"} 41\n"));
  // Rank 1 consumed up to step 6, rank 0 up to step 9.
  EXPECT_THAT(
      text, HasSubstr("packfeed_rank_steps_behind{packfeed_job=\"pre\\\"train\",rank=\"1\"} 3\n"));
  // Every sample line belongs to a family announced before it.
  std::string family;
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.rfind("# TYPE ", 0) == 0) family = line.substr(7, line.find(' ', 7) - 7);
    if (line[0] != '#') {
      EXPECT_TRUE(line.rfind(family + "{", 0) == 0 || line.rfind(family + " ", 0) == 0) << line;
    }
  }
}

// GET `path` from 127.0.0.1:`port`; the whole response.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "write failed";
  }
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  return response;
}

TEST(MetricsServerTest, AnswersGetMetricsAndNothingElse) {
  int scrapes = 0;
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", [&]() -> absl::StatusOr<v1::GetStatsReply> {
        ++scrapes;
        v1::GetStatsReply stats;
        *stats.add_jobs() = SomeJob();
        return stats;
      });
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string metrics = HttpGet((*server)->port(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("200 OK"));
  EXPECT_THAT(metrics, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(metrics, HasSubstr("packfeed_job_steps_served{packfeed_job=\"pre\\\"train\"} 10"));
  EXPECT_THAT(HttpGet((*server)->port(), "/"), HasSubstr("404"));
  EXPECT_EQ(scrapes, 1);
}

TEST(MetricsServerTest, RefusesABadAddressOrATakenPort) {
  auto collect = []() -> absl::StatusOr<v1::GetStatsReply> { return v1::GetStatsReply(); };
  EXPECT_EQ(MetricsServer::Start("no-port", collect).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start("127.0.0.1:0", collect);
  ASSERT_TRUE(first.ok());
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start("127.0.0.1:" + std::to_string((*first)->port()), collect);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("cannot listen on metrics_address"));
}

}  // namespace
}  // namespace packfeed::server
