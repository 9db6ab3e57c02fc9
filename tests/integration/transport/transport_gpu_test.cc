// The ring with a CUDA device: a page-locked host ring (kHost, also what kAuto
// picks) and a ring in device memory (kDevice, when this UCX can register it).
// Skips without a device (every machine without a GPU, including CI's).

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "child_process.h"
#include "gtest/gtest.h"
#include "packfeed/transport/cuda_memory.h"
#include "packfeed/transport/receiver.h"
#include "transport_harness.h"

namespace packfeed::testing {
namespace {

using transport::MemoryKind;

constexpr uint64_t kMaxPayload = 16ull << 20;

class TransportGpuTest : public ::testing::TestWithParam<transport::RingPlacement> {};

// kHost: the page-locked host ring (a UCX built with CUDA has page-locked it
// already, which must count as page-locked); kDevice: device memory.
TEST_P(TransportGpuTest, DeliversIntoTheDeviceOrAPageLockedRing) {
  if (transport::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  transport::ReceiverOptions options;
  options.placement = GetParam();
  options.slots = 3;
  options.slot_bytes = kMaxPayload + (64 << 10);
  auto receiver = transport::Receiver::Create(options);
  if (GetParam() == transport::RingPlacement::kDevice &&
      absl::IsFailedPrecondition(receiver.status())) {
    GTEST_SKIP() << receiver.status();  // a UCX without CUDA (Debian's)
  }
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  if ((*receiver)->memory_kind() == MemoryKind::kHost) {
    EXPECT_TRUE((*receiver)->host_ring_registered_with_cuda());
  }
  auto child = ChildProcess::Spawn(
      {PF_TRANSPORT_PEER, "--role", "sender", "--max-payload", absl::StrCat(kMaxPayload)});
  ASSERT_TRUE(child.ok()) << child.status();
  const std::string address = *child->Receive();
  ASSERT_TRUE(child->Send("connect").ok());
  ASSERT_TRUE(child->Send((*receiver)->worker_address()).ok());
  ASSERT_TRUE(child->Send((*receiver)->ring_descriptor()).ok());
  const std::string reply = *child->Receive();
  uint64_t epoch = 0;
  ASSERT_TRUE(absl::SimpleAtoi(reply.substr(6), &epoch)) << reply;
  ASSERT_TRUE((*receiver)->Connect(address, epoch).ok());
  ASSERT_TRUE(child->Send(absl::StrCat("push ", epoch, " 0 14")).ok());

  std::vector<std::vector<uint8_t>> copies;
  for (uint64_t seq = 0; seq < 14; ++seq) {
    auto slot = (*receiver)->Next(absl::Seconds(20));
    ASSERT_TRUE(slot.ok()) << slot.status();
    transport::ReceivedSlot host = *slot;
    if ((*receiver)->memory_kind() == MemoryKind::kCuda) {
      copies.assign(host.fields.size(), {});
      for (size_t f = 0; f < host.fields.size(); ++f) {
        copies[f].resize(host.fields[f].descriptor.bytes);
        ASSERT_TRUE(
            transport::CudaCopy(copies[f].data(), host.fields[f].data, copies[f].size()).ok());
        host.fields[f].data = copies[f].data();
      }
    }
    absl::Status check = CheckTestMessage(host, seq, kMaxPayload);
    EXPECT_TRUE(check.ok()) << check;
    ASSERT_TRUE((*receiver)->Release(slot->seq).ok());
  }
  EXPECT_EQ(*child->Receive(), "ok");
}

INSTANTIATE_TEST_SUITE_P(Placements, TransportGpuTest,
                         ::testing::Values(transport::RingPlacement::kHost,
                                           transport::RingPlacement::kDevice));

}  // namespace
}  // namespace packfeed::testing
