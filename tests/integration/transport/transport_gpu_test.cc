// The ring with a CUDA device: a page-locked host ring (kHost, also what kAuto
// picks), a ring in device memory (kDevice, when this UCX can register it and
// would write it with a transport rather than emulate the puts) and
// the staged ring (kStagedDevice: host ring copied to the device by the copy
// engine), and the device ring the daemon copies into (kDaemonDevice).
// Skips without a device (every machine without a GPU, CI's too).

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#if PF_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "child_process.h"
#include "gtest/gtest.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/cuda_memory.h"
#include "packfeed/transport/receiver.h"
#include "packfeed/transport/sender.h"
#include "packfeed/transport/shared_ring.h"
#include "transport_harness.h"

namespace packfeed::testing {
namespace {

using transport::MemoryKind;

constexpr uint64_t kMaxPayload = 16ull << 20;

// transport_peer: PF_TRANSPORT_PEER from the environment (a device bundle run
// on another machine: tests/gpu/run_gpu_checks.sh), else where this build put it.
std::string TransportPeer() {
  const char* path = std::getenv("PF_TRANSPORT_PEER");
  return path != nullptr ? path : PF_TRANSPORT_PEER;
}

// A transport_peer sender connected to `receiver`, which pushes `count` test
// messages once `start_pushing` (called between the two) returns.
absl::StatusOr<ChildProcess> StartSender(
    transport::Receiver& receiver, uint64_t count,
    const std::function<void()>& start_pushing = [] {}) {
  PF_ASSIGN_OR_RETURN(ChildProcess child,
                      ChildProcess::Spawn({TransportPeer(), "--role", "sender", "--max-payload",
                                           absl::StrCat(kMaxPayload)}));
  PF_ASSIGN_OR_RETURN(const std::string address, child.Receive());
  PF_RETURN_IF_ERROR(child.Send("connect"));
  PF_RETURN_IF_ERROR(child.Send(receiver.worker_address()));
  PF_RETURN_IF_ERROR(child.Send(receiver.ring_descriptor()));
  PF_ASSIGN_OR_RETURN(const std::string reply, child.Receive());
  PF_ASSIGN_OR_RETURN(const PeerConnection connection, ConnectionOf(reply));
  const uint64_t connection_id = connection.id;
  PF_RETURN_IF_ERROR(receiver.Connect(address, connection_id, connection.key));
  start_pushing();
  PF_RETURN_IF_ERROR(child.Send(absl::StrCat("push ", connection_id, " 0 ", count)));
  return child;
}

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
  auto child = StartSender(**receiver, 14);
  if (GetParam() == transport::RingPlacement::kDevice && !child.ok() &&
      absl::StrContains(child.status().message(), "ring in device memory is refused")) {
    // UCX would emulate the puts (one node, no GPUDirect RDMA): the sender
    // refuses the ring, as it must.
    GTEST_SKIP() << child.status();
  }
  ASSERT_TRUE(child.ok()) << child.status();

  std::vector<std::vector<uint8_t>> copies;
  for (uint64_t seq = 0; seq < 14; ++seq) {
    auto slot = (*receiver)->Next(absl::Seconds(20));
    ASSERT_TRUE(slot.ok()) << slot.status();
    transport::ReceivedSlot host = *slot;
    if ((*receiver)->memory_kind() == MemoryKind::kCuda) {
      // CudaCopy runs on the legacy default stream: it waits for the
      // staged copy (a no-op for the other rings).
      ASSERT_TRUE((*receiver)->StreamWaitsFor(*slot, nullptr).ok());
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
    ASSERT_TRUE((*receiver)->Release(slot->lease).ok());
  }
  EXPECT_EQ(*child->Receive(), "ok");
}

INSTANTIATE_TEST_SUITE_P(Placements, TransportGpuTest,
                         ::testing::Values(transport::RingPlacement::kHost,
                                           transport::RingPlacement::kDevice,
                                           transport::RingPlacement::kStagedDevice));

#if PF_HAVE_CUDA
// A copy stream held shut by a host function until `open`: the staged
// copies queue behind it, so the test sees what waits for them.
void HoldShut(void* open) {
  while (!static_cast<std::atomic<bool>*>(open)->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Reads a staged slot back through `stream` into page-locked `host` (so the
// copy is asynchronous) after that stream waited for the staged copy.
void ReadBack(const transport::Receiver& receiver, const transport::ReceivedSlot& slot,
              cudaStream_t stream, uint8_t* host, transport::ReceivedSlot* view) {
  ASSERT_TRUE(receiver.StreamWaitsFor(slot, stream).ok());
  *view = slot;
  uint64_t offset = 0;
  for (transport::FieldView& field : view->fields) {
    ASSERT_EQ(cudaMemcpyAsync(host + offset, field.data, field.descriptor.bytes,
                              cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    field.data = host + offset;
    offset += field.descriptor.bytes;
  }
}

// The consumer's stream reads a slot only after its copy to the device, and
// the sender gets no credit back before that copy completes: with the copy
// stream held shut, the read waits and at most `slots` slots arrive. Fails
// if StreamWaitsFor does not wait (stale bytes, the read done at once) or a
// credit returns at hand-out or release (more than `slots` arrive).
TEST(StagedRingTest, ReadsAndCreditsWaitForTheCopy) {
  if (transport::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  constexpr uint32_t kSlots = 3;
  constexpr uint64_t kMessages = 8;
  cudaStream_t copy_stream = nullptr;
  cudaStream_t consumer = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kMaxPayload + (64 << 10)), cudaSuccess);
  std::atomic<bool> open{false};
  {
    transport::ReceiverOptions options;
    options.placement = transport::RingPlacement::kStagedDevice;
    options.slots = kSlots;
    options.slot_bytes = kMaxPayload + (64 << 10);
    options.cuda_copy_stream = copy_stream;
    auto receiver = transport::Receiver::Create(options);
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    // A failed assertion below must not leave the copy stream shut: the
    // receiver's destructor waits for it.
    absl::Cleanup open_on_exit = [&open] { open = true; };
    EXPECT_EQ((*receiver)->memory_kind(), MemoryKind::kCuda);
    // Shut only once connected. Shut before, the test hung with UCX 1.22
    // built with CUDA (an H100, 2026-11-26; not with Debian's 1.13), where
    // connecting may make CUDA calls that wait for every stream: the cause
    // is not established.
    auto child = StartSender(**receiver, kMessages, [&] {
      ASSERT_EQ(cudaLaunchHostFunc(copy_stream, &HoldShut, &open), cudaSuccess);
    });
    ASSERT_TRUE(child.ok()) << child.status();

    auto first = (*receiver)->Next(absl::Seconds(20));
    ASSERT_TRUE(first.ok()) << first.status();
    transport::ReceivedSlot view;
    ReadBack(**receiver, *first, consumer, static_cast<uint8_t*>(pinned), &view);
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_EQ(cudaStreamQuery(consumer), cudaErrorNotReady)
        << "the consumer's read did not wait for the copy";
    EXPECT_LE((*receiver)->stats().received, kSlots) << "a credit returned before its copy";
    EXPECT_EQ((*receiver)->stats().copied, 0u);

    open = true;
    ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
    absl::Status check = CheckTestMessage(view, 0, kMaxPayload);
    EXPECT_TRUE(check.ok()) << check;
    ASSERT_TRUE((*receiver)->Release(first->lease, {consumer}).ok());
    for (uint64_t seq = 1; seq < kMessages; ++seq) {
      auto slot = (*receiver)->Next(absl::Seconds(20));
      ASSERT_TRUE(slot.ok()) << slot.status();
      ReadBack(**receiver, *slot, consumer, static_cast<uint8_t*>(pinned), &view);
      ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
      check = CheckTestMessage(view, seq, kMaxPayload);
      EXPECT_TRUE(check.ok()) << check;
      ASSERT_TRUE((*receiver)->Release(slot->lease, {consumer}).ok());
    }
    EXPECT_EQ(*child->Receive(), "ok");
  }
  cudaFreeHost(pinned);
  cudaStreamDestroy(consumer);
  cudaStreamDestroy(copy_stream);
}

// kDaemonDevice, sender and receiver in this process on their own UCX
// workers: the receiver's ring is exported device memory, the sender
// imports it as the daemon does (SharedRing::ImportDevice of the
// descriptor) and copies every slot in before announcing it. Every message
// arrives byte for byte in device memory; and a released slot goes back to
// the sender only once the stream that read it is past the release: with
// that stream held shut, no more than `slots` messages arrive.
TEST(DaemonDeviceRingTest, DeliversIntoDeviceMemoryAndReusesSlotsOnlyAfterTheirReaders) {
  if (transport::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  constexpr uint32_t kSlots = 2;
  constexpr uint64_t kMessages = 8;
  constexpr uint64_t kPayload = 1 << 20;
  transport::ReceiverOptions options;
  options.placement = transport::RingPlacement::kDaemonDevice;
  options.slots = kSlots;
  options.slot_bytes = kPayload + (64 << 10);
  auto receiver = transport::Receiver::Create(options);
  if (absl::IsFailedPrecondition(receiver.status())) {
    GTEST_SKIP() << "this GPU cannot share device memory: " << receiver.status();
  }
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  EXPECT_EQ((*receiver)->memory_kind(), MemoryKind::kCuda);
  const transport::RingOffer offer = (*receiver)->ring_offer();
  ASSERT_TRUE(offer.device());
  auto imported = transport::SharedRing::ImportDevice(ScopedFd(dup((*receiver)->ring_fd())),
                                                      offer.bytes, offer.gpu_uuid);
  ASSERT_TRUE(imported.ok()) << imported.status();
  auto sender = transport::Sender::Create({});
  ASSERT_TRUE(sender.ok()) << sender.status();
  auto connection_id =
      (*sender)->ConnectShared((*receiver)->worker_address(), (*receiver)->ring_descriptor(),
                               std::make_shared<transport::SharedRing>(*std::move(imported)));
  ASSERT_TRUE(connection_id.ok()) << connection_id.status();
  ASSERT_TRUE(
      (*receiver)
          ->Connect((*sender)->worker_address(), *connection_id, *(*sender)->Key(*connection_id))
          .ok());
  EXPECT_TRUE((*sender)->Stats(*connection_id)->device);
  absl::Status pushed;
  std::thread pushing([&] {
    PushReport report;
    pushed = PushTestMessages(**sender, *connection_id, 0, kMessages, kPayload, &report);
  });

  cudaStream_t reader = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<bool> open{false};
  absl::Cleanup open_on_exit = [&open] { open = true; };
  std::vector<uint8_t> host(options.slot_bytes);
  for (uint64_t seq = 0; seq < kMessages; ++seq) {
    auto slot = (*receiver)->Next(absl::Seconds(20));
    ASSERT_TRUE(slot.ok()) << slot.status();
    transport::ReceivedSlot view = *slot;
    uint64_t offset = 0;
    for (transport::FieldView& field : view.fields) {
      ASSERT_TRUE(
          transport::CudaCopy(host.data() + offset, field.data, field.descriptor.bytes).ok());
      field.data = host.data() + offset;
      offset += field.descriptor.bytes;
    }
    absl::Status check = CheckTestMessage(view, seq, kPayload);
    EXPECT_TRUE(check.ok()) << check;
    if (seq == 0) {
      // The reader stream is held shut: slot 0 must not come back yet.
      ASSERT_EQ(cudaLaunchHostFunc(reader, &HoldShut, &open), cudaSuccess);
      ASSERT_TRUE((*receiver)->Release(slot->lease, {reader}).ok());
      auto second = (*receiver)->Next(absl::Seconds(20));
      ASSERT_TRUE(second.ok()) << second.status();
      ASSERT_TRUE((*receiver)->Release(second->lease, {reader}).ok());
      EXPECT_EQ((*receiver)->Next(absl::Milliseconds(500)).status().code(),
                absl::StatusCode::kDeadlineExceeded)
          << "a slot went back while the stream that read it was still shut";
      open = true;
      ++seq;  // the second message was taken above
      continue;
    }
    ASSERT_TRUE((*receiver)->Release(slot->lease, {reader}).ok());
  }
  pushing.join();
  EXPECT_TRUE(pushed.ok()) << pushed;
  ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
  cudaStreamDestroy(reader);
}
#endif  // PF_HAVE_CUDA

}  // namespace
}  // namespace packfeed::testing
