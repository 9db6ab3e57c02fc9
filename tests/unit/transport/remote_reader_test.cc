// RemoteReader between two workers of one process over UCX's shared
// memory: the origin's worker is progressed on a thread of its own, as a
// daemon's transfer thread does.

#include "packfeed/transport/remote_reader.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "packfeed/transport/memory_region.h"

namespace packfeed::transport {
namespace {

class RemoteReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    UcxOptions ucx;
    ucx.transports = "sm,self";
    absl::StatusOr<UcpContext> context = UcpContext::Create(ucx);
    ASSERT_TRUE(context.ok()) << context.status();
    context_.emplace(*std::move(context));
    absl::StatusOr<UcpWorker> origin = UcpWorker::Create(*context_);
    ASSERT_TRUE(origin.ok()) << origin.status();
    origin_.emplace(*std::move(origin));
    absl::StatusOr<UcpWorker> reader = UcpWorker::Create(*context_);
    ASSERT_TRUE(reader.ok()) << reader.status();
    worker_.emplace(*std::move(reader));
    reader_.emplace(*worker_);
    progress_ = std::thread([this] {
      while (!stop_.load()) origin_->ProgressOrWait(absl::Milliseconds(10));
    });
  }
  void TearDown() override {
    stop_ = true;
    if (progress_.joinable()) {
      origin_->Signal();
      progress_.join();
    }
    reader_.reset();
  }

  // A registered region of `bytes` filled with a pattern from `seed`.
  MemoryRegion Region(size_t bytes, uint8_t seed) {
    absl::StatusOr<MemoryRegion> region = MemoryRegion::Allocate(context_->get(), bytes);
    EXPECT_TRUE(region.ok()) << region.status();
    auto* data = static_cast<uint8_t*>(region->address());
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(seed + i * 7);
    return *std::move(region);
  }
  absl::Status ReadFrom(const MemoryRegion& region, absl::Span<const RemoteReader::Read> reads) {
    absl::StatusOr<std::string> key = region.PackRemoteKey();
    if (!key.ok()) return key.status();
    return reader_->ReadAll(origin_->address(), *key, reinterpret_cast<uint64_t>(region.address()),
                            reads, absl::Now() + absl::Seconds(10));
  }

  std::optional<UcpContext> context_;
  std::optional<UcpWorker> origin_;
  std::optional<UcpWorker> worker_;
  std::optional<RemoteReader> reader_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
};

TEST_F(RemoteReaderTest, ReadsEveryPieceFromItsOffsetAndSkipsEmptyOnes) {
  MemoryRegion region = Region(1 << 20, 3);
  const auto* source = static_cast<const uint8_t*>(region.address());
  std::vector<uint8_t> a(4096), b(100000), c(1);
  const std::vector<RemoteReader::Read> reads = {{a.data(), a.size(), 0},
                                                 {b.data(), b.size(), 12345},
                                                 {nullptr, 0, 999},
                                                 {c.data(), 1, 1048575}};
  ASSERT_TRUE(ReadFrom(region, reads).ok());
  EXPECT_EQ(std::memcmp(a.data(), source, a.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), source + 12345, b.size()), 0);
  EXPECT_EQ(c[0], source[1048575]);
}

TEST_F(RemoteReaderTest, ANewRegionOfTheSameOriginIsReadWithItsOwnKey) {
  MemoryRegion first = Region(65536, 1);
  MemoryRegion second = Region(65536, 9);
  std::vector<uint8_t> out(65536);
  ASSERT_TRUE(ReadFrom(first, {{{out.data(), out.size(), 0}}}).ok());
  EXPECT_EQ(std::memcmp(out.data(), first.address(), out.size()), 0);
  ASSERT_TRUE(ReadFrom(second, {{{out.data(), out.size(), 0}}}).ok());
  EXPECT_EQ(std::memcmp(out.data(), second.address(), out.size()), 0);
  ASSERT_TRUE(ReadFrom(first, {{{out.data(), 10, 7}}}).ok());
  EXPECT_EQ(std::memcmp(out.data(), static_cast<const uint8_t*>(first.address()) + 7, 10), 0);
}

}  // namespace
}  // namespace packfeed::transport
