// Sender and Receiver in one process, over UCX's shared memory between two
// workers: each contract of their headers that needs no second process
// (transport_process_test covers deaths, reconnects and other uids).

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/transport/receiver.h"
#include "packfeed/transport/sender.h"

namespace packfeed::transport {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSlots = 2;
constexpr uint64_t kSlotBytes = 64 << 10;

// A host ring of kSlots slots of kSlotBytes over UCX's shared memory.
ReceiverOptions HostRing() {
  ReceiverOptions options;
  options.ucx.transports = "sm,self";
  options.slots = kSlots;
  options.slot_bytes = kSlotBytes;
  options.placement = RingPlacement::kHost;
  return options;
}

class SenderReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SenderOptions sender_options;
    sender_options.ucx.transports = "sm,self";
    absl::StatusOr<std::unique_ptr<Sender>> sender = Sender::Create(sender_options);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = *std::move(sender);

    absl::StatusOr<std::unique_ptr<Receiver>> receiver = Receiver::Create(HostRing());
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = *std::move(receiver);

    absl::StatusOr<uint64_t> id =
        sender_->Connect(receiver_->worker_address(), receiver_->ring_descriptor());
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
    ASSERT_TRUE(receiver_->Connect(sender_->worker_address(), id_, *sender_->Key(id_)).ok());
    ASSERT_EQ(WaitForCredits(kSlots), kSlots);
  }

  // Progresses the sender until it holds `want` credits or 10 s pass; the
  // credits it holds then.
  uint32_t WaitForCredits(uint32_t want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    uint32_t credits = 0;
    while (absl::Now() < deadline) {
      absl::StatusOr<uint32_t> now = sender_->Credits(id_);
      if (!now.ok()) return 0;
      credits = *now;
      if (credits >= want) break;
      sender_->ProgressOrWait(absl::Milliseconds(10));
    }
    return credits;
  }

  // A slot of two fields, `tokens` (int64) and `loss_mask` (bool), whose
  // values follow from `step`; the buffers live as long as the message.
  struct Message {
    std::vector<int64_t> tokens;
    std::vector<uint8_t> mask;
    SlotContent content;
  };
  static std::unique_ptr<Message> MakeMessage(int64_t step, int64_t count) {
    auto message = std::make_unique<Message>();
    for (int64_t i = 0; i < count; ++i) {
      message->tokens.push_back(step * 1000 + i);
      message->mask.push_back(static_cast<uint8_t>((step + i) % 2));
    }
    message->content.step = step;
    message->content.microbatch = 3;
    message->content.inline_metadata = "metadata";
    message->content.fields = {{{"tokens", ElementType::kInt64, {count}}, message->tokens.data()},
                               {{"loss_mask", ElementType::kBool, {count}}, message->mask.data()}};
    return message;
  }

  std::unique_ptr<Sender> sender_;
  std::unique_ptr<Receiver> receiver_;
  uint64_t id_ = 0;
};

TEST_F(SenderReceiverTest, ASlotArrivesWithItsFieldsBytesAndMetadata) {
  const std::unique_ptr<Message> message = MakeMessage(7, 100);
  ASSERT_TRUE(sender_->Push(id_, message->content).ok());
  absl::StatusOr<ReceivedSlot> slot = receiver_->Next(absl::Seconds(10));
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(slot->step, 7);
  EXPECT_EQ(slot->microbatch, 3u);
  EXPECT_EQ(slot->inline_metadata, "metadata");
  ASSERT_EQ(slot->fields.size(), 2u);
  EXPECT_EQ(slot->fields[0].descriptor.name, "tokens");
  EXPECT_EQ(slot->fields[0].descriptor.bytes, 800u);
  EXPECT_EQ(std::memcmp(slot->fields[0].data, message->tokens.data(), 800), 0);
  EXPECT_EQ(slot->fields[1].descriptor.name, "loss_mask");
  EXPECT_EQ(slot->fields[1].descriptor.type, ElementType::kBool);
  EXPECT_EQ(std::memcmp(slot->fields[1].data, message->mask.data(), 100), 0);
  EXPECT_TRUE(receiver_->Release(slot->lease).ok());
}

// Someone who knows a connection's id but not its key (another rank, which
// read its own AttachReply) can neither free its slots nor break it: its
// credits, naming every slot free, are dropped (accepted, this one was
// "older than the credit before it" and failed the connection), and the
// trainer's held slots stay held.
TEST_F(SenderReceiverTest, ACreditWithoutItsConnectionsKeyIsDropped) {
  std::vector<std::unique_ptr<Message>> messages;
  for (uint32_t i = 0; i < kSlots; ++i) {
    messages.push_back(MakeMessage(i, 10));
    ASSERT_TRUE(sender_->Push(id_, messages.back()->content).ok());
  }
  std::vector<ReceivedSlot> held;
  for (uint32_t i = 0; i < kSlots; ++i) {
    absl::StatusOr<ReceivedSlot> slot = receiver_->Next(absl::Seconds(10));
    ASSERT_TRUE(slot.ok()) << slot.status();
    held.push_back(*std::move(slot));
  }
  absl::StatusOr<std::unique_ptr<Receiver>> rogue = Receiver::Create(HostRing());
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  ConnectionKey guess = *sender_->Key(id_);
  guess[15] ^= 0x80;
  ASSERT_TRUE((*rogue)->Connect(sender_->worker_address(), id_, guess).ok());
  // The rogue's first credit names its whole (empty) ring free.
  for (int i = 0; i < 50; ++i) sender_->ProgressOrWait(absl::Milliseconds(10));
  absl::StatusOr<uint32_t> credits = sender_->Credits(id_);
  ASSERT_TRUE(credits.ok()) << credits.status();
  EXPECT_EQ(*credits, 0u);
  const std::unique_ptr<Message> more = MakeMessage(9, 10);
  EXPECT_TRUE(absl::IsResourceExhausted(sender_->Push(id_, more->content)));
  // The trainer's own release still frees a slot.
  ASSERT_TRUE(receiver_->Release(held[0].lease).ok());
  EXPECT_EQ(WaitForCredits(1), 1u);
}

TEST_F(SenderReceiverTest, NextWithNothingAnnouncedIsDeadlineExceeded) {
  absl::StatusOr<ReceivedSlot> slot = receiver_->Next(absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(slot.status())) << slot.status();
}

// The sender may fill only the slots the trainer gave back: each held slot
// is a credit fewer, and a release returns it.
TEST_F(SenderReceiverTest, CreditsComeBackOnlyWhenASlotIsReleased) {
  std::vector<std::unique_ptr<Message>> messages;
  for (int64_t step = 0; step < kSlots; ++step) {
    messages.push_back(MakeMessage(step, 10));
    ASSERT_TRUE(sender_->Push(id_, messages.back()->content).ok());
  }
  EXPECT_EQ(*sender_->Credits(id_), 0u);
  const std::unique_ptr<Message> more = MakeMessage(9, 10);
  EXPECT_TRUE(absl::IsResourceExhausted(sender_->Push(id_, more->content)));

  absl::StatusOr<ReceivedSlot> first = receiver_->Next(absl::Seconds(10));
  absl::StatusOr<ReceivedSlot> second = receiver_->Next(absl::Seconds(10));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->step, 0);
  EXPECT_EQ(second->step, 1);
  sender_->ProgressOrWait(absl::Milliseconds(50));
  EXPECT_EQ(*sender_->Credits(id_), 0u) << "held slots came back as credits";

  // Released out of order: the second first.
  ASSERT_TRUE(receiver_->Release(second->lease).ok());
  EXPECT_EQ(WaitForCredits(1), 1u);
  ASSERT_TRUE(receiver_->Release(first->lease).ok());
  EXPECT_EQ(WaitForCredits(2), 2u);
  absl::StatusOr<ConnectionStats> stats = sender_->Stats(id_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pushed, 2u);
  EXPECT_EQ(stats->released, 2u);
}

TEST_F(SenderReceiverTest, ReleasingALeaseNotHeldIsInvalidArgument) {
  const std::unique_ptr<Message> message = MakeMessage(1, 10);
  ASSERT_TRUE(sender_->Push(id_, message->content).ok());
  absl::StatusOr<ReceivedSlot> slot = receiver_->Next(absl::Seconds(10));
  ASSERT_TRUE(slot.ok()) << slot.status();
  ASSERT_TRUE(receiver_->Release(slot->lease).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(receiver_->Release(slot->lease)));
  EXPECT_TRUE(absl::IsInvalidArgument(receiver_->Release(slot->lease + 1000)));
}

TEST_F(SenderReceiverTest, FieldsLargerThanASlotAreRefusedAndTheConnectionStaysUsable) {
  const std::unique_ptr<Message> too_large = MakeMessage(1, kSlotBytes / 8 + 1);
  const absl::Status refused = sender_->Push(id_, too_large->content);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_EQ(*sender_->Credits(id_), kSlots) << "a refused push took a slot";

  const std::unique_ptr<Message> message = MakeMessage(2, 10);
  ASSERT_TRUE(sender_->Push(id_, message->content).ok());
  absl::StatusOr<ReceivedSlot> slot = receiver_->Next(absl::Seconds(10));
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(slot->step, 2);
}

// What was announced is still handed out after a goodbye; then Next says
// why the receiver is no longer served.
TEST_F(SenderReceiverTest, DisconnectWithAReasonEndsNextAfterWhatWasAnnounced) {
  const std::unique_ptr<Message> message = MakeMessage(4, 10);
  ASSERT_TRUE(sender_->Push(id_, message->content).ok());
  ASSERT_TRUE(sender_->Disconnect(id_, "the job was drained").ok());
  absl::StatusOr<ReceivedSlot> slot = receiver_->Next(absl::Seconds(10));
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(slot->step, 4);
  absl::StatusOr<ReceivedSlot> after = receiver_->Next(absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(after.status())) << after.status();
  EXPECT_THAT(after.status().message(), HasSubstr("the job was drained"));
}

TEST_F(SenderReceiverTest, AnUnknownConnectionIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(sender_->Credits(id_ + 1).status()));
  EXPECT_TRUE(absl::IsNotFound(sender_->Disconnect(id_ + 1)));
  EXPECT_TRUE(absl::IsNotFound(sender_->Stats(id_ + 1).status()));
}

}  // namespace
}  // namespace packfeed::transport
