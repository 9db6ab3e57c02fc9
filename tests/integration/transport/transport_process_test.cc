// The transport between real processes over real UCX: this process is the
// sender (or the receiver) and tests/integration/transport/transport_peer.cc
// is the other side. Every test runs over shared memory and over TCP.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "child_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/transport/receiver.h"
#include "packfeed/transport/sender.h"
#include "packfeed/transport/shared_ring.h"
#include "payload_pattern.h"
#include "transport_harness.h"

namespace packfeed::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using transport::ReceivedSlot;
using transport::Receiver;
using transport::Sender;

constexpr uint64_t kLarge = 64ull << 20;
constexpr uint64_t kSmall = 1ull << 20;
// Room for the largest test payload plus the small fields that ride with it.
constexpr uint64_t SlotBytesFor(uint64_t max_payload) { return max_payload + (64 << 10); }

PeerConnection ConnectionFrom(const std::string& reply) {
  absl::StatusOr<PeerConnection> connection = ConnectionOf(reply);
  EXPECT_TRUE(connection.ok()) << connection.status();
  return connection.value_or(PeerConnection{});
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& transports() const { return GetParam(); }
  bool shared_memory() const { return transports().find("sm") != std::string::npos; }

  std::unique_ptr<Sender> MakeSender() {
    transport::SenderOptions options;
    options.ucx.transports = transports();
    auto sender = Sender::Create(options);
    EXPECT_TRUE(sender.ok()) << sender.status();
    return sender.ok() ? std::move(*sender) : nullptr;
  }

  std::unique_ptr<Receiver> MakeReceiver(uint32_t slots, uint64_t max_payload) {
    transport::ReceiverOptions options;
    options.ucx.transports = transports();
    options.slots = slots;
    options.slot_bytes = SlotBytesFor(max_payload);
    options.placement = transport::RingPlacement::kHost;
    auto receiver = Receiver::Create(options);
    EXPECT_TRUE(receiver.ok()) << receiver.status();
    return receiver.ok() ? std::move(*receiver) : nullptr;
  }

  ChildProcess Spawn(const std::string& role, uint32_t slots = 3, uint64_t max_payload = kLarge,
                     int hold_ms = 0, const std::vector<std::string>& more = {}) {
    std::vector<std::string> argv = {PF_TRANSPORT_PEER,
                                     "--role",
                                     role,
                                     "--tls",
                                     transports(),
                                     "--slots",
                                     absl::StrCat(slots),
                                     "--slot-bytes",
                                     absl::StrCat(SlotBytesFor(max_payload)),
                                     "--max-payload",
                                     absl::StrCat(max_payload),
                                     "--hold-ms",
                                     absl::StrCat(hold_ms)};
    argv.insert(argv.end(), more.begin(), more.end());
    auto child = ChildProcess::Spawn(argv);
    EXPECT_TRUE(child.ok()) << child.status();
    return std::move(*child);
  }

  std::string Receive(ChildProcess& child) {
    auto frame = child.Receive();
    EXPECT_TRUE(frame.ok()) << frame.status();
    return frame.ok() ? *frame : "";
  }

  // A receiver child connected to `sender`; returns the connection's connection_id.
  uint64_t ConnectReceiver(Sender& sender, ChildProcess& receiver) {
    const std::string address = Receive(receiver);
    const std::string ring = Receive(receiver);
    auto connection_id = sender.Connect(address, ring);
    EXPECT_TRUE(connection_id.ok()) << connection_id.status();
    EXPECT_TRUE(receiver
                    .Send(absl::StrCat(
                        "connect ", FormatConnection(*connection_id, *sender.Key(*connection_id))))
                    .ok());
    EXPECT_TRUE(receiver.Send(sender.worker_address()).ok());
    EXPECT_EQ(Receive(receiver), "ok");
    return *connection_id;
  }

  // A sender child connected to `receiver`; returns the connection's connection_id.
  uint64_t ConnectSender(Receiver& receiver, ChildProcess& sender) {
    const std::string address = Receive(sender);
    EXPECT_TRUE(sender.Send("connect").ok());
    EXPECT_TRUE(sender.Send(receiver.worker_address()).ok());
    EXPECT_TRUE(sender.Send(receiver.ring_descriptor()).ok());
    const PeerConnection connection = ConnectionFrom(Receive(sender));
    EXPECT_TRUE(receiver.Connect(address, connection.id, connection.key).ok());
    return connection.id;
  }
};

TEST_P(TransportTest, DeliversEveryByteInOrderFromOneByteTo64MiB) {
  std::unique_ptr<Sender> sender = MakeSender();
  ChildProcess child = Spawn("receiver");
  const uint64_t connection_id = ConnectReceiver(*sender, child);
  constexpr uint64_t kMessages = 21;  // every size three times, 1 to 3 fields each
  ASSERT_TRUE(child.Send(absl::StrCat("receive 0 ", kMessages)).ok());
  PushReport report;
  ASSERT_TRUE(PushTestMessages(*sender, connection_id, 0, kMessages, kLarge, &report).ok());
  EXPECT_EQ(Receive(child), absl::StrCat("ok ", report.bytes));

  auto stats = sender->Stats(connection_id);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pushed, kMessages);
  EXPECT_EQ(stats->bytes, report.bytes);
  // The same-node data path must be shared memory, not TCP loopback.
  const std::string transports = sender->Transports(connection_id).value_or("");
  EXPECT_EQ(stats->mapped, shared_memory()) << transports;
  if (shared_memory()) {
    EXPECT_THAT(transports, Not(HasSubstr("tcp")));
  }
}

TEST_P(TransportTest, SlowReceiverHoldsTheSenderToItsCredits) {
  std::unique_ptr<Sender> sender = MakeSender();
  ChildProcess child = Spawn("receiver", /*slots=*/2, kSmall, /*hold_ms=*/20);
  const uint64_t connection_id = ConnectReceiver(*sender, child);
  ASSERT_TRUE(child.Send("receive 0 12").ok());
  PushReport report;
  ASSERT_TRUE(PushTestMessages(*sender, connection_id, 0, 12, kSmall, &report).ok());
  EXPECT_THAT(Receive(child), StartsWith("ok "));
  EXPECT_LE(report.most_in_flight, 2u);
  EXPECT_GT(report.waits_for_credit, 0u) << "the sender never had to wait";
}

TEST_P(TransportTest, DeadReceiverIsUnavailableOthersContinueAndItReconnects) {
  std::unique_ptr<Sender> sender = MakeSender();
  ChildProcess doomed = Spawn("receiver", 2, kSmall);
  ChildProcess healthy = Spawn("receiver", 2, kSmall);
  const uint64_t doomed_connection = ConnectReceiver(*sender, doomed);
  const uint64_t healthy_connection = ConnectReceiver(*sender, healthy);
  PushReport report;
  ASSERT_TRUE(doomed.Send("receive 0 1000").ok());
  ASSERT_TRUE(healthy.Send("receive 0 40").ok());
  ASSERT_TRUE(PushTestMessages(*sender, doomed_connection, 0, 5, kSmall, &report).ok());
  ASSERT_TRUE(PushTestMessages(*sender, healthy_connection, 0, 5, kSmall, &report).ok());

  doomed.Kill(SIGKILL);
  const absl::Time killed = absl::Now();
  // Reap it as a launcher would: UCX's shared-memory keepalive asks whether
  // the peer process still exists, and a zombie does.
  ASSERT_TRUE(doomed.Wait(absl::Seconds(5)).ok());
  absl::Duration detected = absl::InfiniteDuration();
  for (uint64_t seq = 5; seq < 40; ++seq) {
    ASSERT_TRUE(PushTestMessages(*sender, healthy_connection, seq, 1, kSmall, &report).ok());
    if (detected == absl::InfiniteDuration() && !sender->Credits(doomed_connection).ok()) {
      detected = absl::Now() - killed;
    }
  }
  EXPECT_THAT(Receive(healthy), StartsWith("ok "));
  while (detected == absl::InfiniteDuration() && absl::Now() - killed < absl::Seconds(5)) {
    sender->ProgressOrWait(absl::Milliseconds(20));
    if (!sender->Credits(doomed_connection).ok()) detected = absl::Now() - killed;
  }
  EXPECT_LT(detected, absl::Seconds(2));
  EXPECT_EQ(sender->Credits(doomed_connection).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sender->Push(doomed_connection, {}).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(sender->Disconnect(doomed_connection).code() == absl::StatusCode::kUnavailable);

  // The same rank comes back as a new process: a new connection_id, a fresh ring.
  ChildProcess reborn = Spawn("receiver", 2, kSmall);
  const uint64_t reborn_connection = ConnectReceiver(*sender, reborn);
  EXPECT_NE(reborn_connection, doomed_connection);
  ASSERT_TRUE(reborn.Send("receive 0 6").ok());
  ASSERT_TRUE(PushTestMessages(*sender, reborn_connection, 0, 6, kSmall, &report).ok());
  EXPECT_THAT(Receive(reborn), StartsWith("ok "));
}

TEST_P(TransportTest, DeadSenderEndsNextWithUnavailableAndANewSenderReconnects) {
  std::unique_ptr<Receiver> receiver = MakeReceiver(2, kSmall);
  ChildProcess doomed = Spawn("sender", 2, kSmall);
  const uint64_t first_connection = ConnectSender(*receiver, doomed);
  ASSERT_TRUE(doomed.Send(absl::StrCat("push ", first_connection, " 0 100000")).ok());
  uint64_t bytes = 0;
  ASSERT_TRUE(ReceiveTestMessages(*receiver, 0, 5, kSmall, absl::ZeroDuration(), &bytes).ok());

  doomed.Kill(SIGKILL);
  const absl::Time killed = absl::Now();
  // Reap it as a launcher would: UCX's shared-memory keepalive asks whether
  // the peer process still exists, and a zombie does.
  ASSERT_TRUE(doomed.Wait(absl::Seconds(5)).ok());
  // Slots announced before the death are still whole and are handed out;
  // then Next says the sender is gone instead of hanging.
  uint64_t seq = 5;
  absl::StatusOr<ReceivedSlot> slot;
  while ((slot = receiver->Next(absl::Seconds(10))).ok()) {
    ASSERT_TRUE(CheckTestMessage(*slot, seq++, kSmall).ok());
    ASSERT_TRUE(receiver->Release(slot->lease).ok());
  }
  EXPECT_EQ(slot.status().code(), absl::StatusCode::kUnavailable) << slot.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(2));

  // A sender killed inside a write to the receiver's shared-memory FIFO
  // blocks it for good: a re-attach comes with a fresh worker, the ring the
  // same.
  const std::string old_address = receiver->worker_address();
  const std::string ring = receiver->ring_descriptor();
  ASSERT_TRUE(receiver->RenewWorker().ok());
  EXPECT_NE(receiver->worker_address(), old_address);
  EXPECT_EQ(receiver->ring_descriptor(), ring);
  ChildProcess reborn = Spawn("sender", 2, kSmall);
  const uint64_t second_connection = ConnectSender(*receiver, reborn);
  EXPECT_NE(second_connection, first_connection);
  ASSERT_TRUE(reborn.Send(absl::StrCat("push ", second_connection, " 0 9")).ok());
  absl::Status received =
      ReceiveTestMessages(*receiver, 0, 9, kSmall, absl::ZeroDuration(), &bytes);
  EXPECT_TRUE(received.ok()) << received;
  EXPECT_EQ(Receive(reborn), "ok");
}

// A trainer keeps microbatches alive (1F1B holds up to PP of them) while it
// takes more: the sender fills only the slots released, in any order, and
// never writes one still held.
TEST_P(TransportTest, HeldSlotsAreNeverOverwrittenAndOthersAreReusedInAnyOrder) {
  std::unique_ptr<Receiver> receiver = MakeReceiver(3, kSmall);
  ChildProcess child = Spawn("sender", 3, kSmall);
  const uint64_t connection_id = ConnectSender(*receiver, child);
  constexpr uint64_t kMessages = 40;
  ASSERT_TRUE(child.Send(absl::StrCat("push ", connection_id, " 0 ", kMessages)).ok());
  // Message 0 is held to the end; of the rest, every other one is held until
  // the one after it arrives, so releases come out of order.
  std::vector<ReceivedSlot> held;
  std::optional<ReceivedSlot> previous;
  for (uint64_t seq = 0; seq < kMessages; ++seq) {
    auto slot = receiver->Next(absl::Seconds(20));
    // Seen once in CI (a 2-core VM under the whole suite) and not since: the
    // figures say on which side the next occurrence stalls.
    const transport::ReceiverStats stats = receiver->stats();
    ASSERT_TRUE(slot.ok()) << slot.status() << " waiting for message " << seq << "; received "
                           << stats.received << ", released " << stats.released << ", held "
                           << stats.held << ", stale " << stats.stale_messages;
    ASSERT_TRUE(CheckTestMessage(*slot, seq, kSmall).ok()) << seq;
    if (seq == 0) {
      held.push_back(*slot);
    } else if (seq % 2 == 1) {
      previous = *slot;
    } else {
      ASSERT_TRUE(receiver->Release(slot->lease).ok());
      ASSERT_TRUE(receiver->Release(previous->lease).ok());  // the older one, later
      EXPECT_TRUE(CheckTestMessage(held[0], 0, kSmall).ok()) << "held slot overwritten at " << seq;
    }
  }
  EXPECT_EQ(Receive(child), "ok");
  EXPECT_TRUE(CheckTestMessage(held[0], 0, kSmall).ok());
  EXPECT_EQ(receiver->stats().held, 2u);  // message 0, and the last odd one
  EXPECT_EQ(receiver->Release(held[0].lease).code(), absl::StatusCode::kOk);
  EXPECT_EQ(receiver->Release(held[0].lease).code(), absl::StatusCode::kInvalidArgument)
      << "a second release of one lease";
  EXPECT_EQ(receiver->Release(12345).code(), absl::StatusCode::kInvalidArgument);
}

// The daemon restarts while the trainer holds a microbatch: the new sender
// is not told that slot is free, and the old lease still releases it.
TEST_P(TransportTest, ASlotHeldAcrossAReconnectStaysTheTrainers) {
  std::unique_ptr<Receiver> receiver = MakeReceiver(2, kSmall);
  ChildProcess first = Spawn("sender", 2, kSmall);
  const uint64_t first_connection = ConnectSender(*receiver, first);
  ASSERT_TRUE(first.Send(absl::StrCat("push ", first_connection, " 0 1")).ok());
  auto kept = receiver->Next(absl::Seconds(20));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(Receive(first), "ok");
  first.Kill(SIGKILL);
  ASSERT_TRUE(first.Wait(absl::Seconds(5)).ok());

  ASSERT_TRUE(receiver->RenewWorker().ok());
  ChildProcess second = Spawn("sender", 2, kSmall);
  const uint64_t second_connection = ConnectSender(*receiver, second);
  ASSERT_TRUE(second.Send(absl::StrCat("push ", second_connection, " 0 12")).ok());
  uint64_t bytes = 0;
  ASSERT_TRUE(ReceiveTestMessages(*receiver, 0, 12, kSmall, absl::ZeroDuration(), &bytes).ok());
  EXPECT_EQ(Receive(second), "ok");
  EXPECT_TRUE(CheckTestMessage(*kept, 0, kSmall).ok()) << "the held slot was overwritten";
  ASSERT_TRUE(receiver->Release(kept->lease).ok());
  EXPECT_EQ(receiver->stats().released, 12u) << "the old lease counts for its own connection";
  EXPECT_EQ(receiver->stats().held, 0u);
}

// A trainer of another uid than the daemon's: UCX's shared memory does not
// connect the two, so its ring is a sealed memfd it hands over a Unix socket;
// the sender writes it directly and only the notifications travel by UCX.
TEST_P(TransportTest, ARingSharedByFileDescriptorServesAReceiverOfAnotherUid) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the receiver as nobody";
  if (shared_memory()) GTEST_SKIP() << "UCX's shared memory does not connect two uids";
  const std::string dir = ::testing::TempDir() + absl::StrCat("pf-shared-ring-", getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::all);
  const std::string path = dir + "/rings.sock";
  ScopedFd listening(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  path.copy(address.sun_path, sizeof(address.sun_path) - 1);
  std::filesystem::remove(path);
  ASSERT_EQ(bind(listening.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  std::filesystem::permissions(path, std::filesystem::perms::all);
  ASSERT_EQ(listen(listening.get(), 4), 0);

  std::unique_ptr<Sender> sender = MakeSender();
  ChildProcess child = Spawn("receiver", 2, kSmall, 0, {"--uid", "65534", "--ring-socket", path});
  const std::string receiver_address = Receive(child);
  const std::string ring = Receive(child);
  EXPECT_EQ(sender->Connect(receiver_address, ring).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a keyless ring needs its file descriptor";
  ScopedFd peer(accept4(listening.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(peer.valid());
  absl::StatusOr<transport::PeerIdentity> who = transport::PeerOf(peer.get());
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->uid, 65534u);
  auto received = transport::ReceiveWithFd(peer.get());
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->first, "packfeed-ring");
  auto descriptor = transport::DecodeRingDescriptor(ring);
  ASSERT_TRUE(descriptor.ok()) << descriptor.status();
  EXPECT_TRUE(descriptor->shared_by_fd());
  EXPECT_EQ(
      transport::SharedRing::Map(ScopedFd(dup(received->second.get())), descriptor->slot_bytes)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument)
      << "a ring of another size than its descriptor's";
  auto shared = transport::SharedRing::Map(std::move(received->second),
                                           descriptor->slots * descriptor->slot_bytes);
  ASSERT_TRUE(shared.ok()) << shared.status();
  auto connection_id = sender->ConnectShared(
      receiver_address, ring, std::make_shared<transport::SharedRing>(*std::move(shared)));
  ASSERT_TRUE(connection_id.ok()) << connection_id.status();
  ASSERT_TRUE(child
                  .Send(absl::StrCat(
                      "connect ", FormatConnection(*connection_id, *sender->Key(*connection_id))))
                  .ok());
  ASSERT_TRUE(child.Send(sender->worker_address()).ok());
  ASSERT_EQ(Receive(child), "ok");

  ASSERT_TRUE(child.Send("receive 0 30").ok());
  PushReport report;
  ASSERT_TRUE(PushTestMessages(*sender, *connection_id, 0, 30, kSmall, &report).ok());
  EXPECT_THAT(Receive(child), StartsWith("ok "));
  EXPECT_TRUE(sender->Stats(*connection_id)->mapped);
  std::filesystem::remove_all(dir);
}

// What a peer could do to the memory it handed the daemon. A HugeTLB memfd
// is refused (its owner could drain the huge-page pool, and the daemon's
// next write would be SIGBUS). A hole punched in an ordinary one, which no
// seal the daemon can live with stops, costs only the bytes: the daemon's
// next write there faults in a new page, and it lives. Truncating it is
// refused by its seals.
TEST(SharedRingTest, RefusesHugeTlbAndLivesThroughHolesPunchedUnderIt) {
  // A kernel without hugetlbfs cannot make one (and no peer can hand one).
  ScopedFd huge(memfd_create("huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB));
  if (huge.valid()) {
    const uint64_t huge_bytes = 2 << 20;
    ASSERT_EQ(ftruncate(huge.get(), static_cast<off_t>(huge_bytes)), 0);
    ASSERT_EQ(fcntl(huge.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    auto refused = transport::SharedRing::Map(std::move(huge), huge_bytes);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("HugeTLB"));
  } else {
    std::printf("no HugeTLB memfd on this kernel (%s): that refusal is not tried\n",
                std::strerror(errno));
  }

  const uint64_t bytes = 64 << 10;
  auto ring = transport::SharedRing::Create(bytes);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto daemons = transport::SharedRing::Map(ScopedFd(dup(ring->fd())), bytes);
  ASSERT_TRUE(daemons.ok()) << daemons.status();
  std::memset(daemons->data(), 0x5a, bytes);
  ASSERT_EQ(fallocate(ring->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                      static_cast<off_t>(bytes)),
            0)
      << std::strerror(errno);
  EXPECT_EQ(daemons->data()[100], 0) << "the hole reads as zeros";
  std::memset(daemons->data(), 0x33, bytes);  // a write into the hole: no SIGBUS
  EXPECT_EQ(ring->data()[bytes - 1], 0x33);
  EXPECT_NE(ftruncate(ring->fd(), 0), 0) << "sealed: it cannot be cut under the daemon";
}

TEST(SharedRingTest, RefusesARingThatCouldShrinkAndAMessageWithoutItsDescriptor) {
  // Not sealed: a client could truncate it under the daemon (SIGBUS).
  ScopedFd unsealed(memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(unsealed.get(), 4096), 0);
  auto mapped = transport::SharedRing::Map(std::move(unsealed), 4096);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mapped.status().message(), HasSubstr("F_SEAL_SHRINK"));

  auto ring = transport::SharedRing::Create(8192);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_NE(ftruncate(ring->fd(), 4096), 0) << "the client's own ring cannot shrink either";
  ring->data()[8191] = 7;
  auto again = transport::SharedRing::Map(ScopedFd(dup(ring->fd())), 8192);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data()[8191], 7) << "both maps see the same memory";
  EXPECT_EQ(transport::SharedRing::Map(ScopedFd(dup(ring->fd())), 4096).status().code(),
            absl::StatusCode::kInvalidArgument);

  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  ScopedFd a(pair[0]), b(pair[1]);
  ASSERT_EQ(write(a.get(), "no fd", 5), 5);
  auto received = transport::ReceiveWithFd(b.get());
  EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(received.status().message(), HasSubstr("0 descriptors"));
  ASSERT_TRUE(transport::SendWithFd(a.get(), "ring", ring->fd()).ok());
  received = transport::ReceiveWithFd(b.get());
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->first, "ring");
}

TEST_P(TransportTest, RefusesAPayloadLargerThanASlotAndStaysUsable) {
  std::unique_ptr<Sender> sender = MakeSender();
  ChildProcess child = Spawn("receiver", 2, kSmall);
  const uint64_t connection_id = ConnectReceiver(*sender, child);
  PushReport report;
  // Wait for the receiver's first credit, then push one byte too many.
  ASSERT_TRUE(child.Send("receive 0 1").ok());
  std::vector<uint8_t> big(SlotBytesFor(kSmall) + 1);
  transport::SlotContent content;
  content.fields.push_back(
      {{"tokens", transport::ElementType::kUInt8, {static_cast<int64_t>(big.size())}}, big.data()});
  absl::Status status = sender->Push(connection_id, content);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(big.size(), " bytes")));
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(SlotBytesFor(kSmall), " bytes")));
  ASSERT_TRUE(PushTestMessages(*sender, connection_id, 0, 1, kSmall, &report).ok());
  EXPECT_THAT(Receive(child), StartsWith("ok "));
}

TEST_P(TransportTest, PacksInPlaceThroughAMappedSlotOnSharedMemoryOnly) {
  std::unique_ptr<Sender> sender = MakeSender();
  ChildProcess child = Spawn("receiver", 2, kSmall);
  const uint64_t connection_id = ConnectReceiver(*sender, child);
  while (sender->Credits(connection_id).value_or(0) == 0)
    sender->ProgressOrWait(absl::Milliseconds(20));
  absl::StatusOr<transport::MappedSlot> mapped = sender->MapNextSlot(connection_id);
  if (!shared_memory()) {
    EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
    return;
  }
  ASSERT_TRUE(child.Send("receive 0 7").ok());
  for (uint64_t seq = 0; seq < 7; ++seq) {
    while (sender->Credits(connection_id).value_or(0) == 0) {
      sender->ProgressOrWait(absl::Milliseconds(20));
    }
    mapped = sender->MapNextSlot(connection_id);
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    EXPECT_EQ(mapped->seq, seq);
    transport::SlotContent content;
    content.step = static_cast<int64_t>(seq);
    content.microbatch = static_cast<uint32_t>(seq % 7);
    content.inline_metadata = absl::StrCat("seq=", seq);
    std::vector<transport::FieldSpec> specs = TestFields(seq, kSmall);
    auto layout = transport::LayoutFields(specs, mapped->bytes);
    ASSERT_TRUE(layout.ok()) << layout.status();
    for (size_t f = 0; f < specs.size(); ++f) {
      FillPattern(mapped->data + (*layout)[f].offset, (*layout)[f].bytes, seq,
                  static_cast<uint32_t>(f));
      content.fields.push_back({specs[f], nullptr});
    }
    ASSERT_TRUE(sender->CommitMapped(connection_id, content).ok());
  }
  EXPECT_THAT(Receive(child), StartsWith("ok "));
}

// A rogue peer sends the receiver hand-made notifications.
class RogueSenderTest : public TransportTest {
 protected:
  void SetUp() override {
    receiver_ = MakeReceiver(2, kSmall);
    rogue_.emplace(Spawn("rogue"));
    rogue_address_ = Receive(*rogue_);
    ASSERT_TRUE(rogue_->Send("connect").ok());
    ASSERT_TRUE(rogue_->Send(receiver_->worker_address()).ok());
    ASSERT_EQ(Receive(*rogue_), "ok");
  }
  void Accept(uint64_t connection_id) {
    // The rogue ignores credits: any key does.
    ASSERT_TRUE(receiver_->Connect(rogue_address_, connection_id, {}).ok());
  }
  void Send(const std::string& bytes) {
    ASSERT_TRUE(rogue_->Send("send").ok());
    ASSERT_TRUE(rogue_->Send(bytes).ok());
    ASSERT_EQ(Receive(*rogue_), "sent");
  }
  // A slot message: `header` as given, data = `notification` + `payload`.
  void SendSlot(const std::string& header, const std::string& notification,
                const std::string& payload) {
    ASSERT_TRUE(rogue_->Send("send-slot").ok());
    ASSERT_TRUE(rogue_->Send(header).ok());
    ASSERT_TRUE(rogue_->Send(notification + payload).ok());
    ASSERT_EQ(Receive(*rogue_), "sent");
  }
  static std::string LengthHeader(uint64_t length) {
    return std::string(reinterpret_cast<const char*>(&length), sizeof(length));
  }
  // A notification of one 32-byte field at offset 256.
  static std::string ReadyWithField(uint64_t connection_id) {
    transport::SlotReady ready;
    ready.connection_id = connection_id;
    ready.fields.push_back({"tokens", transport::ElementType::kInt64, {1, 4}, 256, 32});
    return transport::EncodeMessage(ready);
  }
  static std::string Ready(uint64_t connection_id, uint64_t seq, std::string text,
                           std::optional<uint32_t> slot = std::nullopt) {
    transport::SlotReady ready;
    ready.connection_id = connection_id;
    ready.seq = seq;
    ready.slot = slot.value_or(static_cast<uint32_t>(seq % 2));
    ready.inline_metadata = std::move(text);
    return transport::EncodeMessage(ready);
  }

  std::unique_ptr<Receiver> receiver_;
  std::optional<ChildProcess> rogue_;
  std::string rogue_address_;
};

TEST_P(RogueSenderTest, DropsNotificationsOfAnotherConnection) {
  Accept(77);
  Send(Ready(76, 0, "stale"));
  Send(Ready(77, 0, "fresh"));
  auto slot = receiver_->Next(absl::Seconds(5));
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(slot->inline_metadata, "fresh");
  EXPECT_EQ(receiver_->stats().stale_messages, 1u);
}

TEST_P(RogueSenderTest, RefusesANotificationIntoASlotNotFree) {
  Accept(8);
  Send(Ready(8, 0, "first", 1));
  Send(Ready(8, 1, "into the same slot", 1));
  auto first = receiver_->Next(absl::Seconds(5));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->inline_metadata, "first");
  auto second = receiver_->Next(absl::Seconds(5));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(second.status().message(), HasSubstr("slot 1, which is not free"));
}

TEST_P(RogueSenderTest, RefusesAnotherProtocolVersionByName) {
  Accept(5);
  std::string message = Ready(5, 0, "from the future");
  const uint16_t version = 99;
  std::memcpy(message.data() + 4, &version, sizeof(version));
  Send(message);
  auto slot = receiver_->Next(absl::Seconds(5));
  EXPECT_EQ(slot.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(slot.status().message(), HasSubstr("v99"));
}

TEST_P(RogueSenderTest, HandsOutNothingOfAFieldOutsideItsSlot) {
  Accept(9);
  transport::SlotReady ready;
  ready.connection_id = 9;
  ready.fields.push_back(
      {"tokens", transport::ElementType::kInt64, {1, 4}, SlotBytesFor(kSmall) - 16, 32});
  Send(transport::EncodeMessage(ready));
  auto slot = receiver_->Next(absl::Seconds(5));
  EXPECT_EQ(slot.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(slot.status().message(), HasSubstr("outside"));
  // The receiver takes a new connection afterwards.
  Accept(10);
  Send(Ready(10, 0, "after"));
  slot = receiver_->Next(absl::Seconds(5));
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(slot->inline_metadata, "after");
}

TEST_P(RogueSenderTest, SlotMessageDeliversItsBytesIntoTheSlot) {
  Accept(4);
  const std::string notification = ReadyWithField(4);
  std::string payload(32, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7 + 1);
  SendSlot(LengthHeader(notification.size()), notification, payload);
  auto slot = receiver_->Next(absl::Seconds(5));
  ASSERT_TRUE(slot.ok()) << slot.status();
  ASSERT_EQ(slot->fields.size(), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(slot->fields[0].data), 32), payload);
}

TEST_P(RogueSenderTest, HandsOutNothingOfASlotMessageWhoseBytesDoNotMatchItsFields) {
  Accept(4);
  const std::string notification = ReadyWithField(4);
  SendSlot(LengthHeader(notification.size()), notification, std::string(16, 'x'));
  auto slot = receiver_->Next(absl::Seconds(5));
  EXPECT_EQ(slot.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(slot.status().message(), HasSubstr("carries 16 bytes for fields of 32"));
}

TEST_P(RogueSenderTest, HandsOutNothingOfASlotMessageWithABadHeader) {
  Accept(4);
  const std::string notification = ReadyWithField(4);
  SendSlot(LengthHeader(notification.size() + 1000), notification, std::string(32, 'x'));
  auto slot = receiver_->Next(absl::Seconds(5));
  EXPECT_EQ(slot.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(slot.status().message(), HasSubstr("malformed slot message"));
}

TEST_P(RogueSenderTest, GoodbyeEndsTheStreamAfterWhatWasAnnounced) {
  Accept(3);
  Send(Ready(3, 0, "last"));
  Send(transport::EncodeMessage(transport::Goodbye{3, ""}));
  auto slot = receiver_->Next(absl::Seconds(5));
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(slot->inline_metadata, "last");
  slot = receiver_->Next(absl::Seconds(5));
  EXPECT_EQ(slot.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(slot.status().message(), HasSubstr("closed"));
}

// A real receiver's host ring, announced as a ring in device memory: the
// sender asks UCX how it would put into it and, UCX describing no zero-copy
// transport write, refuses the ring by name and goes on serving others. With
// UCX's protocols v2 (UCX_PROTO_ENABLE=y) the put is named: TCP's emulation.
TEST_P(TransportTest, RefusesADeviceRingUcxWouldNotWriteWithATransport) {
  for (const bool protocols_v2 : {false, true}) {
    if (protocols_v2) setenv("UCX_PROTO_ENABLE", "y", /*overwrite=*/1);
    std::unique_ptr<Sender> sender = MakeSender();
    unsetenv("UCX_PROTO_ENABLE");
    ChildProcess refused = Spawn("receiver", 2, kSmall);
    const std::string address = Receive(refused);
    absl::StatusOr<transport::RingDescriptor> ring =
        transport::DecodeRingDescriptor(Receive(refused));
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring->memory_kind = transport::MemoryKind::kCuda;
    auto connection_id = sender->Connect(address, transport::EncodeRingDescriptor(*ring));
    EXPECT_EQ(connection_id.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(connection_id.status().message(), HasSubstr("ring in device memory is refused"));
    EXPECT_THAT(connection_id.status().message(), HasSubstr("staged device ring"));
    if (protocols_v2) {
      EXPECT_THAT(connection_id.status().message(),
                  HasSubstr(shared_memory() ? "not known to be zero-copy" : "emulated"));
    }

    ChildProcess served = Spawn("receiver", 2, kSmall);
    const uint64_t served_connection = ConnectReceiver(*sender, served);
    ASSERT_TRUE(served.Send("receive 0 3").ok());
    PushReport report;
    ASSERT_TRUE(PushTestMessages(*sender, served_connection, 0, 3, kSmall, &report).ok());
    EXPECT_EQ(Receive(served), absl::StrCat("ok ", report.bytes));
  }
}

// A receiver that stopped answering (SIGSTOP, a hung host) holds the
// sending thread, and every other connection of it, no longer than a
// goodbye's wait (2 s): over TCP, UCX completes the goodbye's flush only
// when the peer answers, which once took the whole operation timeout (30 s).
// Abandon waits on nothing.
TEST_P(TransportTest, AStoppedReceiverHoldsTheSenderNoLongerThanAGoodbyesWait) {
  std::unique_ptr<Sender> sender = MakeSender();
  ChildProcess told = Spawn("receiver");
  ChildProcess dropped = Spawn("receiver");
  const uint64_t told_connection = ConnectReceiver(*sender, told);
  const uint64_t dropped_connection = ConnectReceiver(*sender, dropped);
  // Slots it has not read yet, as a trainer holding its ring has.
  for (uint64_t connection_id : {told_connection, dropped_connection}) {
    PushReport report;
    ASSERT_TRUE(PushTestMessages(*sender, connection_id, 0, 1, kSmall, &report).ok());
  }
  told.Kill(SIGSTOP);
  dropped.Kill(SIGSTOP);
  absl::Time start = absl::Now();
  sender->Disconnect(told_connection, "the job cannot be served").IgnoreError();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  start = absl::Now();
  EXPECT_TRUE(sender->Abandon(dropped_connection).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(absl::IsNotFound(sender->Abandon(dropped_connection)));
  told.Kill(SIGKILL);
  dropped.Kill(SIGKILL);
}

// Ending a sender (a drain) says goodbye to every receiver at once: two
// stopped receivers hold it one goodbye's wait, where one after the other
// held it two, and a live receiver still gets its goodbye.
TEST_P(TransportTest, EndingASenderWaitsOneGoodbyeForAllItsStoppedReceivers) {
  std::unique_ptr<Sender> sender = MakeSender();
  ChildProcess live = Spawn("receiver");
  std::vector<ChildProcess> stopped;
  for (int i = 0; i < 2; ++i) stopped.push_back(Spawn("receiver"));
  ConnectReceiver(*sender, live);
  for (ChildProcess& receiver : stopped) {
    const uint64_t connection_id = ConnectReceiver(*sender, receiver);
    PushReport report;
    ASSERT_TRUE(PushTestMessages(*sender, connection_id, 0, 1, kSmall, &report).ok());
    receiver.Kill(SIGSTOP);
  }
  ASSERT_TRUE(live.Send("receive 0 1").ok());  // a slot that never comes
  const absl::Time start = absl::Now();
  sender.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3.5));
  EXPECT_THAT(Receive(live), HasSubstr("the sender closed it"));
  for (ChildProcess& receiver : stopped) receiver.Kill(SIGKILL);
}

// A ring outlives its connections: a receiver attaching again may still
// hold slot 0's microbatch while the new sender asks UCX, with a put into
// that slot, how it writes a ring in device memory. The put writes back the
// bytes that were there. (A host ring announced as device memory, in this
// process: the test reads the slot itself.)
TEST_P(TransportTest, TheDeviceRingProbeLeavesAHeldSlotAsItWas) {
  transport::ReceiverOptions options;
  options.ucx.transports = transports();
  options.slots = 2;
  options.slot_bytes = kSmall;
  auto receiver = Receiver::Create(options);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  absl::StatusOr<transport::RingDescriptor> ring =
      transport::DecodeRingDescriptor((*receiver)->ring_descriptor());
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto* slot = reinterpret_cast<uint8_t*>(ring->base_address);
  for (uint64_t i = 0; i < kSmall; ++i) slot[i] = static_cast<uint8_t>(i * 7 + 3);
  ring->memory_kind = transport::MemoryKind::kCuda;
  std::unique_ptr<Sender> sender = MakeSender();
  auto connection_id =
      sender->Connect((*receiver)->worker_address(), transport::EncodeRingDescriptor(*ring));
  EXPECT_EQ(connection_id.status().code(), absl::StatusCode::kFailedPrecondition);
  uint64_t changed = 0;
  for (uint64_t i = 0; i < kSmall; ++i) changed += slot[i] != static_cast<uint8_t>(i * 7 + 3);
  EXPECT_EQ(changed, 0u) << "of " << kSmall << " bytes of the held slot";
}

TEST(TransportProtocolTest, SenderRefusesARingOfAnotherProtocolVersion) {
  auto sender = Sender::Create({});
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::string ring =
      transport::EncodeRingDescriptor({2, 4096, 0x10000, transport::MemoryKind::kHost, "key"});
  const uint16_t version = transport::kWireVersion + 1;
  std::memcpy(ring.data() + 4, &version, sizeof(version));
  auto connection_id = (*sender)->Connect("some address", ring);
  EXPECT_EQ(connection_id.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(connection_id.status().message(), HasSubstr(absl::StrCat("v", version)));
  EXPECT_THAT(connection_id.status().message(),
              HasSubstr(absl::StrCat("v", transport::kWireVersion)));
}

INSTANTIATE_TEST_SUITE_P(OverSharedMemoryAndTcp, RogueSenderTest,
                         ::testing::Values("sm,self", "tcp,self"), [](const auto& info) {
                           return info.param == "sm,self" ? "SharedMemory" : "Tcp";
                         });

INSTANTIATE_TEST_SUITE_P(OverSharedMemoryAndTcp, TransportTest,
                         ::testing::Values("sm,self", "tcp,self"), [](const auto& info) {
                           return info.param == "sm,self" ? "SharedMemory" : "Tcp";
                         });

}  // namespace
}  // namespace packfeed::testing
