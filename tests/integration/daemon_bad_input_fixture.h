// The fixture of the bad-input tests (daemon_bad_input_test.cc, whose
// request tables are daemon_bad_input_cases.cc): one real packfeedd for the
// suite, its gRPC stubs over the Unix socket and TCP, and a good rank's
// step as hashes of its fields.
#ifndef PACKFEED_TESTS_INTEGRATION_DAEMON_BAD_INPUT_FIXTURE_H_
#define PACKFEED_TESTS_INTEGRATION_DAEMON_BAD_INPUT_FIXTURE_H_

#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "child_process.h"
#include "client/src/share_ring.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "packfeed/client/client.h"
#include "packfeed/client/producer.h"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/transport/receiver.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/wire.h"
#include "packfeed/v1/service.grpc.pb.h"
#include "server/config/fingerprint.h"

// A named namespace, not an anonymous one: the fixture's static members are
// shared by the files that include this.
namespace packfeed::bad_input {

using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret";
constexpr uid_t kNobody = 65534;

// A TCP port on loopback that nothing listens on now.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  return ok ? ntohs(address.sin_port) : -1;
}

struct BadRequest {
  std::string name;
  std::function<grpc::Status()> send;
  grpc::StatusCode code;
  std::string message;
};

class DaemonBadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::filesystem::temp_directory_path() /
                           absl::StrCat("pf-bad-input-", getpid()));
    std::filesystem::create_directories(*dir_);
    const std::string prefix = *dir_ + "/data";
    dataset::GeneratedDatasetOptions dataset;
    dataset.vocab_size = 5000;
    auto lengths = dataset::GenerateLengths({4, 120, 40, 1.1}, 300, 5);
    ASSERT_TRUE(lengths.ok());
    ASSERT_TRUE(dataset::WriteGeneratedDataset(prefix, *lengths, dataset).ok());
    socket_ = new std::string(*dir_ + "/packfeedd.sock");
    // Ranks may attach over TCP too, as from a node without a daemon.
    const int port = FreePort();
    ASSERT_GT(port, 0);
    tcp_address_ = new std::string(absl::StrCat("127.0.0.1:", port));
    std::ofstream(*dir_ + "/config.textproto")
        << absl::StrCat("socket_path: \"", *socket_, "\"\nstate_dir: \"", *dir_, "/state\"\n",
                        "admin_tcp_address: \"", *tcp_address_, "\"\nadmin_tcp_token: \"adm\"\n",
                        "ranks_over_tcp: true\nranks_over_tcp_without_tls: true\n",
                        // nobody too: a second uid refused for its token, not its uid.
                        "allowed_uids: [0, ", getuid(), ", ", kNobody, "]\n",
                        R"(ingest_streams {
  name: "rollouts"
  auth_token: "driver-secret"
  fields { name: "logprobs" dtype: "float32" }
}
ingest_streams {
  name: "small"
  auth_token: "driver-secret"
  memory_budget_bytes: 1048576
}
jobs {
  name: "job"
  datasets { prefix: ")",
                        prefix, R"(" }
  topology { tp: 1 pp: 1 cp: 1 dp: 4 }
  global_batch: 8
  seq_length: 128
  eod_id: 5000
  append_eod: true
  auth_token: ")",
                        kToken, R"("
  local_ranks: [0, 1, 2]
  scheduler { kind: "balanced" max_tokens_per_rank: 128 }
})");
    auto daemon = testing::ChildProcess::Spawn(
        {PF_PACKFEEDD, "--config", *dir_ + "/config.textproto", "--log-level", "warn"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = new testing::ChildProcess(*std::move(daemon));
    admin_ = v1::Admin::NewStub(Channel()).release();
    control_ = v1::Control::NewStub(Channel()).release();
    control_over_tcp_ =
        v1::Control::NewStub(grpc::CreateChannel(*tcp_address_, grpc::InsecureChannelCredentials()))
            .release();
    ingest_ = v1::Ingest::NewStub(Channel()).release();
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (true) {
      grpc::ClientContext context;
      v1::HealthReply health;
      if (admin_->Health(&context, {}, &health).ok()) break;
      ASSERT_LT(absl::Now(), deadline) << "packfeedd did not answer";
      absl::SleepFor(absl::Milliseconds(100));
    }  // Where nobody may connect (as root: the daemon makes its sockets 0660).
    if (geteuid() == 0) {
      std::filesystem::permissions(*dir_, std::filesystem::perms(0755));
      std::filesystem::permissions(*socket_, std::filesystem::perms(0666));
      std::filesystem::permissions(*socket_ + ".rings", std::filesystem::perms(0666));
    }
  }

  static void TearDownTestSuite() {
    daemon_->Kill(SIGTERM);
    EXPECT_EQ(*daemon_->Wait(absl::Seconds(20)), 0);
    delete daemon_;
    std::filesystem::remove_all(*dir_);
  }

  static std::shared_ptr<grpc::Channel> Channel() {
    return grpc::CreateChannel("unix:" + *socket_, grpc::InsecureChannelCredentials());
  }

  static client::ClientOptions Options(int rank) {
    client::ClientOptions options;
    options.socket_path = *socket_;
    options.job = "job";
    options.global_rank = rank;
    options.auth_token = kToken;
    options.placement = transport::RingPlacement::kHost;
    return options;
  }

  // StableHash of every field's bytes of the client's next step.
  static std::vector<uint64_t> TakeStep(client::Client& client) {
    std::vector<uint64_t> hashes;
    absl::StatusOr<client::StepInfo> step = client.NextStep(absl::Seconds(30));
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return hashes;
    for (int m = step->first_microbatch; m < step->num_microbatches; ++m) {
      absl::StatusOr<client::Microbatch> mb = client.Next(absl::Seconds(30));
      EXPECT_TRUE(mb.ok()) << mb.status();
      if (!mb.ok()) return hashes;
      for (const client::FieldView& field : mb->fields) {
        hashes.push_back(server::StableHash(
            absl::string_view(static_cast<const char*>(field.data), field.bytes)));
      }
    }
    return hashes;
  }

  // Requests the daemon must refuse, by name, each spoiled from a good
  // one: attaches of a would-be rank 1 (its ring, and a ring too small),
  // a rank's and the admin's queries, and ingest's calls.
  struct WouldBeRank {
    std::string fingerprint;
    std::string worker_address;
    std::string ring_descriptor;
    std::string small_ring_descriptor;
  };
  static std::vector<BadRequest> AttachCases(const WouldBeRank& rank);
  static std::vector<BadRequest> QueryCases();
  static std::vector<BadRequest> IngestCases();

  static inline std::string* dir_ = nullptr;
  static inline std::string* socket_ = nullptr;
  static inline std::string* tcp_address_ = nullptr;
  static inline testing::ChildProcess* daemon_ = nullptr;
  static inline v1::Admin::Stub* admin_ = nullptr;
  static inline v1::Control::Stub* control_ = nullptr;
  static inline v1::Control::Stub* control_over_tcp_ = nullptr;
  static inline v1::Ingest::Stub* ingest_ = nullptr;
};

// A put of one sample of `tokens` tokens into stream "small", step 0.
inline v1::ReserveRequest ReserveOf(uint64_t tokens) {
  v1::ReserveRequest request;
  v1::PutRequest& put = *request.mutable_put();
  put.set_stream("small");
  put.set_auth_token("driver-secret");
  put.set_step(0);
  v1::IngestSample& sample = *put.add_samples();
  sample.set_group(1);
  sample.set_tokens(tokens);
  put.mutable_region()->set_length(tokens * sizeof(int64_t));
  return request;
}

}  // namespace packfeed::bad_input

#endif  // PACKFEED_TESTS_INTEGRATION_DAEMON_BAD_INPUT_FIXTURE_H_
