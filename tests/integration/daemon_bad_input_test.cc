// Bad requests against a real packfeedd while a good rank is being served:
// each is refused with its own status and a message naming what is wrong,
// and between every two of them the good rank receives its next step,
// bit-identical to an undisturbed run (no wrong bytes, nobody else held up).
// The ledger shows the good rank's consumption exact at the end.

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

namespace packfeed {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret";
constexpr uid_t kNobody = 65534;

// A TCP port on loopback that nothing listens on now.
int FreePort() {
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
v1::ReserveRequest ReserveOf(uint64_t tokens) {
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

std::vector<BadRequest> DaemonBadInputTest::AttachCases(const WouldBeRank& rank) {
  auto attach = [rank](std::function<void(v1::AttachRequest&)> spoil,
                       v1::Control::Stub* control = control_) {
    return [rank, spoil, control] {
      v1::AttachRequest request;
      request.set_job("job");
      request.set_global_rank(1);
      request.set_auth_token(kToken);
      request.set_fingerprint(rank.fingerprint);
      request.set_worker_address(rank.worker_address);
      request.mutable_ring()->set_slots(2);
      request.mutable_ring()->set_slot_bytes(4 << 20);
      request.mutable_ring()->set_ring_descriptor(rank.ring_descriptor);
      spoil(request);
      v1::AttachReply reply;
      grpc::ClientContext context;
      return control->Attach(&context, request, &reply);
    };
  };
  std::string other_topology = rank.fingerprint;
  other_topology.replace(other_topology.find("-t") + 2, 8, "00000000");

  using grpc::StatusCode;
  return {
      {"unknown job", attach([](auto& r) { r.set_job("nope"); }), StatusCode::NOT_FOUND,
       "no job 'nope'"},
      {"wrong token", attach([](auto& r) { r.set_auth_token("guess"); }),
       StatusCode::PERMISSION_DENIED, "wrong auth token"},
      {"no token", attach([](auto& r) { r.clear_auth_token(); }), StatusCode::PERMISSION_DENIED,
       "wrong auth token"},
      {"rank outside the world", attach([](auto& r) { r.set_global_rank(99); }),
       StatusCode::OUT_OF_RANGE, "outside job job's world of 4"},
      {"rank of another node", attach([](auto& r) { r.set_global_rank(3); }),
       StatusCode::FAILED_PRECONDITION, "not hosted by this daemon"},
      {"fingerprint of another topology",
       attach([other_topology](auto& r) { r.set_fingerprint(other_topology); }),
       StatusCode::FAILED_PRECONDITION, "topology differ"},
      {"not a fingerprint", attach([](auto& r) { r.set_fingerprint("pf1-garbage"); }),
       StatusCode::INVALID_ARGUMENT, "not a packfeed job fingerprint"},
      {"no ring descriptor", attach([](auto& r) { r.mutable_ring()->clear_ring_descriptor(); }),
       StatusCode::INVALID_ARGUMENT, "ring descriptor"},
      {"garbage ring descriptor",
       attach([](auto& r) { r.mutable_ring()->set_ring_descriptor(std::string(40, '\x7f')); }),
       StatusCode::INVALID_ARGUMENT, "ring descriptor"},
      {"ring slots too small", attach([small = rank.small_ring_descriptor](auto& r) {
         r.mutable_ring()->set_ring_descriptor(small);
       }),
       StatusCode::INVALID_ARGUMENT, "are needed"},
      {"negative start step", attach([](auto& r) { r.set_start_step(-3); }),
       StatusCode::INVALID_ARGUMENT, "start step -3 < 0"},
      {"start microbatch beyond its step", attach([](auto& r) { r.set_start_microbatch(999); }),
       StatusCode::INVALID_ARGUMENT, "start microbatch 999 of step 0"},
      {"elastic without a fingerprint", attach([](auto& r) {
         r.set_elastic(true);
         r.clear_fingerprint();
       }),
       StatusCode::INVALID_ARGUMENT, "elastic resume needs the fingerprint"},
      {"elastic inside a step", attach([](auto& r) {
         r.set_elastic(true);
         r.set_start_microbatch(1);
       }),
       StatusCode::INVALID_ARGUMENT, "step boundary"},
      {"rank already attached", attach([](auto& r) { r.set_global_rank(0); }),
       StatusCode::ALREADY_EXISTS, "already attached"},
      {"garbage worker address", attach([](auto& r) { r.set_worker_address("not an address"); }),
       StatusCode::INVALID_ARGUMENT, "worker address"},
      // No descriptor crosses TCP, and no uid proves whose ring a token names.
      {"over TCP: a ring shared by descriptor",
       attach([](auto& r) { r.mutable_ring()->set_shared_ring_token("token"); }, control_over_tcp_),
       StatusCode::PERMISSION_DENIED, "shared memory is handed over only on the Unix socket"},
      {"over TCP: wrong token",
       attach([](auto& r) { r.set_auth_token("guess"); }, control_over_tcp_),
       StatusCode::PERMISSION_DENIED, "wrong auth token"},
  };
}

std::vector<BadRequest> DaemonBadInputTest::QueryCases() {
  auto describe = [](std::string job, std::string token) {
    return [job, token] {
      v1::DescribeRequest request;
      request.set_job(job);
      request.set_auth_token(token);
      v1::DescribeReply reply;
      grpc::ClientContext context;
      return control_->Describe(&context, request, &reply);
    };
  };
  auto detach = [](std::function<void(v1::DetachRequest&)> spoil) {
    return [spoil] {
      v1::DetachRequest request;
      request.set_job("job");
      request.set_global_rank(0);
      request.set_auth_token(kToken);
      request.set_connection_id(12345);
      spoil(request);
      v1::DetachReply reply;
      grpc::ClientContext context;
      return control_->Detach(&context, request, &reply);
    };
  };
  auto report = [](std::function<void(v1::ReportRequest&)> spoil) {
    return [spoil] {
      v1::ReportRequest request;
      request.set_job("job");
      request.set_global_rank(0);
      request.set_connection_id(12345);
      spoil(request);
      v1::ReportReply reply;
      grpc::ClientContext context;
      return control_->Report(&context, request, &reply);
    };
  };
  using grpc::StatusCode;
  return {
      {"detach: unknown job", detach([](auto& r) { r.set_job("nope"); }), StatusCode::NOT_FOUND,
       "no job 'nope'"},
      {"report: more measured microbatches than a report holds", report([](auto& r) {
         for (int i = 0; i < 1025; ++i) r.add_computed()->set_seconds(0.01f);
       }),
       StatusCode::INVALID_ARGUMENT, "1025 measured microbatches, at most 1024 per report"},
      // A detach proves itself by the connection's key, never the job's
      // token alone: another rank's connection cannot be ended with it.
      {"detach: the job's token, no key", detach([](auto& r) { r.set_auth_token(kToken); }),
       StatusCode::PERMISSION_DENIED, "connection 12345 with that key is not the rank's"},
      {"detach: another connection", detach([](auto&) {}), StatusCode::PERMISSION_DENIED,
       "connection 12345 with that key is not the rank's"},
      {"plan: unknown job",
       [] {
         v1::GetPlanRequest request;
         request.set_job("nope");
         v1::GetPlanReply reply;
         grpc::ClientContext context;
         return admin_->GetPlan(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "nope"},
      {"plan: negative step",
       [] {
         v1::GetPlanRequest request;
         request.set_job("job");
         request.set_step(-1);
         v1::GetPlanReply reply;
         grpc::ClientContext context;
         return admin_->GetPlan(&context, request, &reply);
       },
       StatusCode::INVALID_ARGUMENT, "step -1 < 0"},
      {"describe: unknown job", describe("nope", kToken), StatusCode::NOT_FOUND,
       "no job 'nope' on this daemon (jobs: job"},
      {"describe: wrong token", describe("job", "guess"), StatusCode::PERMISSION_DENIED,
       "wrong auth token"},
      {"stats: unknown job",
       [] {
         v1::GetStatsRequest request;
         request.set_job("nope");
         v1::GetStatsReply reply;
         grpc::ClientContext context;
         return admin_->GetStats(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no job 'nope'"},
      {"ledger: unknown job",
       [] {
         v1::GetLedgerRequest request;
         request.set_job("nope");
         v1::GetLedgerReply reply;
         grpc::ClientContext context;
         return admin_->GetLedger(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no job 'nope'"},
  };
}

std::vector<BadRequest> DaemonBadInputTest::IngestCases() {
  // A step forwarded as a peer daemon would, spoiled.
  auto forward = [](std::function<void(v1::ForwardStepRequest&)> spoil) {
    return [spoil] {
      v1::ForwardStepRequest request;
      request.set_stream("rollouts");
      request.set_step(0);
      v1::PutRequest* put = request.add_puts();
      put->set_stream("rollouts");
      put->set_auth_token("driver-secret");
      put->set_step(0);
      put->add_fields("logprobs");
      put->mutable_region()->set_length(1 << 20);
      v1::IngestSample* sample = put->add_samples();
      sample->set_tokens(10);
      sample->set_offset(0);
      sample->add_field_offsets(80);
      sample->add_field_bytes(40);
      spoil(request);
      v1::ForwardStepReply reply;
      grpc::ClientContext context;
      return admin_->ForwardStep(&context, request, &reply);
    };
  };
  using grpc::StatusCode;
  return {
      {"forward: unknown stream", forward([](auto& r) { r.set_stream("nope"); }),
       StatusCode::NOT_FOUND, "no ingest stream 'nope'"},
      {"forward: wrong stream token",
       forward([](auto& r) { r.mutable_puts(0)->set_auth_token("guess"); }),
       StatusCode::PERMISSION_DENIED, "auth token"},
      {"forward: a put of another step", forward([](auto& r) { r.mutable_puts(0)->set_step(3); }),
       StatusCode::INVALID_ARGUMENT, "forwarded step 0 of stream rollouts: a put of another step"},
      {"forward: a field shorter than its tokens",
       forward([](auto& r) { r.mutable_puts(0)->mutable_samples(0)->set_field_bytes(0, 36); }),
       StatusCode::INVALID_ARGUMENT, "field 'logprobs' has 36 bytes"},
      {"reserve: an arena never shared",
       [] {
         v1::ReserveRequest request = ReserveOf(10);
         request.set_arena(999);
         v1::ReserveReply reply;
         grpc::ClientContext context;
         return ingest_->Reserve(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no staging arena 999"},
      {"reserve: an arena token never given",
       [] {
         v1::ReserveRequest request = ReserveOf(10);
         request.set_arena_token("nope");
         v1::ReserveReply reply;
         grpc::ClientContext context;
         return ingest_->Reserve(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no ring was shared under that token"},
      {"put: an arena never shared",
       [] {
         v1::ReserveRequest request = ReserveOf(10);
         request.set_arena(999);
         v1::PutReply reply;
         grpc::ClientContext context;
         return ingest_->Put(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no staging arena 999"},
      {"put: an arena token in place of its arena",
       [] {
         v1::ReserveRequest request = ReserveOf(10);
         request.set_arena_token("nope");
         v1::PutReply reply;
         grpc::ClientContext context;
         return ingest_->Put(&context, request, &reply);
       },
       StatusCode::INVALID_ARGUMENT, "names its arena, not an arena token"},
      {"commit: a lease never given",
       [] {
         v1::CommitRequest request;
         request.set_stream("small");
         request.set_auth_token("driver-secret");
         request.set_arena(999);
         request.set_lease(1);
         v1::PutReply reply;
         grpc::ClientContext context;
         return ingest_->Commit(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no staging arena 999"},
      {"drain: wrong token",
       [] {
         v1::DrainRequest request;
         request.set_auth_token("guess");
         v1::DrainReply reply;
         grpc::ClientContext context;
         return admin_->Drain(&context, request, &reply);
       },
       StatusCode::PERMISSION_DENIED, "auth token"},
  };
}

// Run by AProducerThatExitsBetweenReserveAndCommitHoldsNoRoom in a process
// of its own: shares a staging arena, reserves a put and exits without
// committing it.
TEST(ProducerThatExits, DISABLED_ReservesAndExits) {
  const char* socket = std::getenv("PF_RESERVE_SOCKET");
  if (socket == nullptr) GTEST_SKIP() << "run by the test that needs it";
  auto arena = transport::SharedRing::Create(2 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto token = client::ShareRing(std::string(socket) + ".rings", arena->fd(),
                                 transport::RingOffer{arena->bytes(), ""}, absl::Seconds(10));
  ASSERT_TRUE(token.ok()) << token.status();
  auto ingest = v1::Ingest::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
  v1::ReserveRequest request = ReserveOf(100'000);
  request.set_arena_token(*token);
  grpc::ClientContext context;
  v1::ReserveReply reply;
  const grpc::Status reserved = ingest->Reserve(&context, request, &reply);
  ASSERT_TRUE(reserved.ok()) << reserved.error_message();
  std::_Exit(0);  // no Commit, no ReleaseArena
}

// A host ring shared by descriptor for rank 2, and its Attach naming the
// ring token `token` (what the client sends).
struct SharedRingAttach {
  std::unique_ptr<transport::Receiver> ring;
  v1::AttachRequest request;
};
SharedRingAttach SharedRingAttachOf(const std::string& token, const std::string& ucx_transports) {
  transport::ReceiverOptions options;
  options.placement = transport::RingPlacement::kHost;
  options.shared_by_fd = true;
  options.ucx.transports = ucx_transports;
  options.slots = 2;
  options.slot_bytes = 4 << 20;
  absl::StatusOr<std::unique_ptr<transport::Receiver>> ring = transport::Receiver::Create(options);
  EXPECT_TRUE(ring.ok()) << ring.status();
  SharedRingAttach out;
  if (!ring.ok()) return out;
  out.ring = *std::move(ring);
  out.request.set_job("job");
  out.request.set_global_rank(2);
  out.request.set_auth_token(kToken);
  out.request.set_worker_address(out.ring->worker_address());
  out.request.mutable_ring()->set_slots(options.slots);
  out.request.mutable_ring()->set_slot_bytes(options.slot_bytes);
  out.request.mutable_ring()->set_ring_descriptor(out.ring->ring_descriptor());
  out.request.mutable_ring()->set_shared_ring_token(token);
  return out;
}

// A process that got hold of another's ring token (PF_THIEF_TOKEN) and
// presents it in its Attach, as rank 2, with a ring and worker of its own;
// as uid PF_THIEF_UID when set. Run by the tests below.
TEST(RingTokenThief, DISABLED_PresentsACapturedToken) {
  const char* socket = std::getenv("PF_THIEF_SOCKET");
  const char* token = std::getenv("PF_THIEF_TOKEN");
  if (socket == nullptr || token == nullptr) GTEST_SKIP() << "run by the test that needs it";
  if (const char* uid = std::getenv("PF_THIEF_UID"); uid != nullptr) {
    const auto id = static_cast<uid_t>(std::stoul(uid));
    ASSERT_EQ(setgroups(0, nullptr), 0);
    ASSERT_EQ(setgid(id), 0);
    ASSERT_EQ(setuid(id), 0);
  }
  // A ring and worker of its own (TCP: shared memory does not cross uids).
  const SharedRingAttach thief = SharedRingAttachOf(token, "tcp");
  ASSERT_NE(thief.ring, nullptr);
  auto control = v1::Control::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
  v1::AttachReply reply;
  grpc::ClientContext context;
  const grpc::Status attached = control->Attach(&context, thief.request, &reply);
  EXPECT_EQ(attached.error_code(), grpc::StatusCode::PERMISSION_DENIED) << attached.error_message();
  EXPECT_THAT(attached.error_message(),
              HasSubstr("a token is good only for the process that shared the ring"));
}

class RingTokenTest : public DaemonBadInputTest {
 protected:
  // Shares a ring as rank 2's client would, lets `thief_uid` (this uid when
  // nullopt) present its token from another process, then attaches with it:
  // the thief is refused and the owner keeps its ring.
  void ThiefIsRefusedAndTheOwnerKeepsItsRing(std::optional<uid_t> thief_uid) {
    SharedRingAttach owner = SharedRingAttachOf("", "");
    ASSERT_NE(owner.ring, nullptr);
    auto token = client::ShareRing(*socket_ + ".rings", owner.ring->ring_fd(),
                                   owner.ring->ring_offer(), absl::Seconds(10));
    ASSERT_TRUE(token.ok()) << token.status();
    owner.request.mutable_ring()->set_shared_ring_token(*token);

    ASSERT_EQ(setenv("PF_THIEF_SOCKET", socket_->c_str(), 1), 0);
    ASSERT_EQ(setenv("PF_THIEF_TOKEN", token->c_str(), 1), 0);
    if (thief_uid.has_value()) {
      ASSERT_EQ(setenv("PF_THIEF_UID", absl::StrCat(*thief_uid).c_str(), 1), 0);
    }
    auto thief = testing::ChildProcess::Spawn(
        {"/proc/self/exe", "--gtest_also_run_disabled_tests",
         "--gtest_filter=RingTokenThief.DISABLED_PresentsACapturedToken"});
    unsetenv("PF_THIEF_UID");
    ASSERT_TRUE(thief.ok()) << thief.status();
    EXPECT_EQ(*thief->Wait(absl::Seconds(60)), 0) << "the thief was not refused as it should be";

    v1::AttachReply reply;
    grpc::ClientContext context;
    const grpc::Status attached = control_->Attach(&context, owner.request, &reply);
    ASSERT_TRUE(attached.ok()) << "the owner lost its ring: " << attached.error_message();
    v1::DetachRequest detach;
    detach.set_job("job");
    detach.set_global_rank(2);
    detach.set_connection_id(reply.connection_id());
    detach.set_connection_key(reply.connection_key());
    v1::DetachReply detached;
    grpc::ClientContext detach_context;
    EXPECT_TRUE(control_->Detach(&detach_context, detach, &detached).ok());
  }
};

TEST_F(RingTokenTest, ACapturedTokenFromAnotherProcessIsRefused) {
  ThiefIsRefusedAndTheOwnerKeepsItsRing(std::nullopt);
}

TEST_F(RingTokenTest, ACapturedTokenFromAnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to present the token as another uid";
  ThiefIsRefusedAndTheOwnerKeepsItsRing(kNobody);
}

TEST_F(DaemonBadInputTest, EveryBadRequestIsRefusedByNameAndAGoodRankIsServedExactly) {
  // The undisturbed run of rank 0 (then rank 0 rewinds to step 0 below).
  std::vector<std::vector<uint64_t>> reference;
  {
    auto client = client::Client::Attach(Options(0));
    ASSERT_TRUE(client.ok()) << client.status();
    for (int s = 0; s < 40; ++s) reference.push_back(TakeStep(**client));
  }
  auto good = client::Client::Attach(Options(0));
  ASSERT_TRUE(good.ok()) << good.status();
  const std::string fingerprint = (*good)->fingerprint();

  // A real ring and worker for the would-be rank 1, and a ring too small.
  transport::ReceiverOptions ring_options;
  ring_options.placement = transport::RingPlacement::kHost;
  ring_options.slots = 2;
  ring_options.slot_bytes = 4 << 20;
  auto ring = transport::Receiver::Create(ring_options);
  ASSERT_TRUE(ring.ok()) << ring.status();
  ring_options.slot_bytes = 4096;
  auto small = transport::Receiver::Create(ring_options);
  ASSERT_TRUE(small.ok()) << small.status();

  const std::vector<BadRequest> cases = [&] {
    std::vector<BadRequest> all =
        AttachCases({fingerprint, (*ring)->worker_address(), (*ring)->ring_descriptor(),
                     (*small)->ring_descriptor()});
    for (auto* more : {&QueryCases, &IngestCases}) {
      for (BadRequest& request : more()) all.push_back(std::move(request));
    }
    return all;
  }();
  ASSERT_LE(cases.size(), reference.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const grpc::Status status = cases[i].send();
    EXPECT_EQ(status.error_code(), cases[i].code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(cases[i].message));
    // Meanwhile the good rank goes on, byte for byte as undisturbed.
    EXPECT_EQ(TakeStep(**good), reference[i]);
  }
  ASSERT_TRUE((*good)->Detach().ok());

  grpc::ClientContext context;
  v1::GetLedgerRequest request;
  request.set_job("job");
  v1::GetLedgerReply ledger;
  ASSERT_TRUE(admin_->GetLedger(&context, request, &ledger).ok());
  const v1::RankLedger& rank0 = ledger.jobs(0).ranks(0);
  EXPECT_EQ(rank0.global_rank(), 0u);
  EXPECT_EQ(rank0.duplicates(), 0u);
  EXPECT_EQ(rank0.gaps(), 0u);
  EXPECT_EQ(rank0.rewinds(), 1u);  // the reference run, then again from step 0
  EXPECT_EQ(rank0.next_step(), static_cast<int64_t>(cases.size()));
}

// A driver killed between reserving a put and committing it: the daemon
// notices its process is gone and gives its room back, so the stream's
// budget (1 MiB, 0.8 of it reserved by the dead producer) takes a put of as
// much from another producer.
TEST_F(DaemonBadInputTest, AProducerThatExitsBetweenReserveAndCommitHoldsNoRoom) {
  ASSERT_EQ(setenv("PF_RESERVE_SOCKET", socket_->c_str(), 1), 0);
  auto helper =
      testing::ChildProcess::Spawn({"/proc/self/exe", "--gtest_also_run_disabled_tests",
                                    "--gtest_filter=ProducerThatExits.DISABLED_ReservesAndExits"});
  ASSERT_TRUE(helper.ok()) << helper.status();
  EXPECT_EQ(*helper->Wait(absl::Seconds(30)), 0);
  client::ProducerOptions options;
  options.socket_path = *socket_;
  options.stream = "small";
  options.auth_token = "driver-secret";
  auto producer = client::Producer::Create(options);
  ASSERT_TRUE(producer.ok()) << producer.status();
  const std::vector<int64_t> tokens(100'000, 7);
  client::ProducerSample sample;
  sample.group = 2;
  sample.tokens = tokens;
  auto put = (*producer)->Put(0, {}, {sample}, absl::Seconds(10));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->samples_held, 1u);
  EXPECT_EQ(put->bytes_held, tokens.size() * sizeof(int64_t));
}

// A put in one call goes only where the daemon's last answer named a free
// span: one over a committed put's span, past the arena or off the 64-byte
// grid is refused and leaves the committed samples as they were; one in a
// free span joins its step, and the answer names the spans left.
TEST_F(DaemonBadInputTest, APutInOneCallOutsideTheFreeSpansIsRefused) {
  auto arena = transport::SharedRing::Create(1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto token = client::ShareRing(*socket_ + ".rings", arena->fd(),
                                 transport::RingOffer{arena->bytes(), ""}, absl::Seconds(10));
  ASSERT_TRUE(token.ok()) << token.status();
  auto put_of = [](uint64_t tokens) {
    v1::ReserveRequest request = ReserveOf(tokens);
    request.mutable_put()->set_step(5);
    request.mutable_put()->mutable_samples(0)->set_group(3);
    return request;
  };
  v1::ReserveRequest first = put_of(1000);
  first.set_arena_token(*token);
  v1::ReserveReply reserved;
  {
    grpc::ClientContext context;
    const grpc::Status status = ingest_->Reserve(&context, first, &reserved);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  auto* written = reinterpret_cast<int64_t*>(arena->data() + reserved.offset());
  std::fill(written, written + 1000, 5);
  v1::PutReply committed;
  {
    v1::CommitRequest commit;
    commit.set_stream("small");
    commit.set_auth_token("driver-secret");
    commit.set_arena(reserved.arena());
    commit.set_lease(reserved.lease());
    grpc::ClientContext context;
    const grpc::Status status = ingest_->Commit(&context, commit, &committed);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_GT(committed.free_spans_size(), 0);
  for (const v1::ArenaFreeSpan& span : committed.free_spans()) {
    EXPECT_EQ(span.offset() % 64, 0u);
    const bool apart = span.offset() >= reserved.offset() + 8000 ||
                       span.offset() + span.length() <= reserved.offset();
    EXPECT_TRUE(apart) << "free span at " << span.offset() << " overlaps the committed put";
  }
  const uint64_t free_at = committed.free_spans(0).offset();
  auto put_at = [&](uint64_t offset) {
    v1::ReserveRequest request = put_of(10);
    request.set_arena(reserved.arena());
    request.set_written_at(offset);
    grpc::ClientContext context;
    v1::PutReply reply;
    grpc::Status status = ingest_->Put(&context, request, &reply);
    return std::make_pair(status, reply);
  };
  for (const uint64_t offset : {reserved.offset(), uint64_t{arena->bytes()}, free_at + 8}) {
    SCOPED_TRACE(offset);
    const grpc::Status status = put_at(offset).first;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
    EXPECT_THAT(status.error_message(), HasSubstr("is not free"));
  }
  EXPECT_TRUE(std::all_of(written, written + 1000, [](int64_t t) { return t == 5; }));
  std::fill_n(reinterpret_cast<int64_t*>(arena->data() + free_at), 10, 6);
  const auto [status, reply] = put_at(free_at);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.samples_held(), 2u);
  ASSERT_GT(reply.free_spans_size(), 0);
  EXPECT_EQ(reply.free_spans(0).offset(), free_at + 128);  // 80 bytes, on the 64-byte grid
}

// Not a bad request, but the C++ side of a trainer's fault that must not
// become wrong bytes: a Microbatch handle holds its slot, whatever the
// trainer takes meanwhile, and holding more than the ring leaves the daemon
// a slot to fill (the client copies) instead of waiting forever.
TEST_F(DaemonBadInputTest, HeldMicrobatchesKeepTheirBytesAndTheRingNeverRunsDry) {
  client::ClientOptions options = Options(2);
  options.slots = 3;
  auto client = client::Client::Attach(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto hashes = [](const client::Microbatch& mb) {
    std::vector<uint64_t> out;
    for (const client::FieldView& field : mb.fields) {
      out.push_back(
          server::StableHash(absl::string_view(static_cast<const char*>(field.data), field.bytes)));
    }
    return out;
  };
  std::deque<std::pair<client::Microbatch, std::vector<uint64_t>>> held;  // the last 4
  uint64_t taken = 0;
  while (taken < 16) {
    absl::StatusOr<client::StepInfo> step = (*client)->NextStep(absl::Seconds(30));
    ASSERT_TRUE(step.ok()) << step.status();
    for (int m = 0; m < step->num_microbatches; ++m, ++taken) {
      absl::StatusOr<client::Microbatch> mb = (*client)->Next(absl::Seconds(30));
      ASSERT_TRUE(mb.ok()) << mb.status();
      EXPECT_LE((*client)->Ring().held, 2u) << "the daemon must keep a slot to fill";
      held.emplace_back(*mb, hashes(*mb));
      if (held.size() > 4) {
        EXPECT_EQ(hashes(held.front().first), held.front().second) << "changed while held";
        held.pop_front();
      }
    }
  }
  for (const auto& [mb, arrived] : held) EXPECT_EQ(hashes(mb), arrived) << "changed while held";
  const client::RingUse use = (*client)->Ring();
  EXPECT_EQ(use.handed_out, taken);
  EXPECT_GT(use.copied_out, 0u) << "4 held in a 3-slot ring";
  EXPECT_LT(use.copied_out, taken);

  // A chunk shares its microbatch's hold; Release drops a handle and its views.
  while (!held.empty() && held.back().first.copied_out) held.pop_back();
  ASSERT_FALSE(held.empty());
  client::Microbatch chunk = held.back().first.Chunk(0);
  held.clear();
  EXPECT_EQ((*client)->Ring().held, 1u);
  chunk.Release();
  EXPECT_TRUE(chunk.fields.empty());
  EXPECT_EQ((*client)->Ring().held, 0u);
}

}  // namespace
}  // namespace packfeed
