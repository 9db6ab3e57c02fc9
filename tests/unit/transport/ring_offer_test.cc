// What a client says when it hands the daemon its ring's descriptor: a
// host memfd or device memory exported on a GPU named by its UUID.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "packfeed/transport/cuda_memory.h"
#include "packfeed/transport/cuda_shared_memory.h"
#include "packfeed/transport/shared_ring.h"

namespace packfeed::transport {
namespace {

using ::testing::HasSubstr;

const std::string kUuid = "0123456789abcdef0123456789abcdef";

TEST(RingOfferTest, BothFormsRoundTrip) {
  const RingOffer host{65536, ""};
  EXPECT_EQ(FormatRingOffer(host), "packfeed-ring 65536");
  const RingOffer device{2 << 20, kUuid};
  EXPECT_EQ(FormatRingOffer(device), "packfeed-device-ring 2097152 " + kUuid);
  for (const RingOffer& offer : {host, device}) {
    absl::StatusOr<RingOffer> parsed = ParseRingOffer(FormatRingOffer(offer));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->bytes, offer.bytes);
    EXPECT_EQ(parsed->gpu_uuid, offer.gpu_uuid);
    EXPECT_EQ(parsed->device(), offer.device());
  }
}

TEST(RingOfferTest, AnythingElseIsRefusedNamingBothForms) {
  for (const std::string& bad :
       {std::string("hello"), std::string("packfeed-ring"), std::string("packfeed-ring 0"),
        std::string("packfeed-ring -4"), std::string("packfeed-ring 12 extra"),
        std::string("packfeed-device-ring 4096"), "packfeed-device-ring 0 " + kUuid,
        "packfeed-device-ring 4096 " + kUuid.substr(1),
        "packfeed-device-ring 4096 " + std::string(32, 'G'),
        "packfeed-device-ring 4096 GPU-" + kUuid.substr(4), "packfeed-ring 4096 " + kUuid,
        std::string("packfeed-ring  4096"), std::string("packfeed-ring 04096"),
        std::string("packfeed-ring +4096"), std::string("packfeed-ring 4096 ")}) {
    absl::StatusOr<RingOffer> parsed = ParseRingOffer(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("not \"packfeed-ring BYTES\" or \"packfeed-device-ring BYTES GPU-UUID\""))
        << bad;
  }
}

// Without a GPU (or the toolkit) every step of a device ring says why, the
// reason a client gives for staging its own copies.
TEST(SharedDeviceMemoryTest, WithoutADeviceEachSideSaysWhy) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present: tests/gpu covers it";
  EXPECT_EQ(CheckSharedDeviceMemory(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ExportedDeviceMemory::Create(0, 1 << 20).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<SharedRing> imported = SharedRing::ImportDevice(ScopedFd(), 1 << 20, kUuid);
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(imported.status().message(),
              ::testing::AnyOf(HasSubstr("no CUDA device"), HasSubstr("without the CUDA toolkit")));
}

}  // namespace
}  // namespace packfeed::transport
