// Bad requests against a real packfeedd while a good rank is being served:
// each is refused with its own status and a message naming what is wrong,
// and between every two of them the good rank receives its next step,
// bit-identical to an undisturbed run (no wrong bytes, nobody else held up).
// The ledger shows the good rank's consumption exact at the end.

#include "daemon_bad_input_fixture.h"

namespace packfeed::bad_input {
namespace {

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
}  // namespace packfeed::bad_input
