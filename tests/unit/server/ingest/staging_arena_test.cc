// The spans a producer's staging arena hands out (staging_arena.h): first
// fit from the lowest address, aligned, free neighbours merged, and a span
// back in the arena once the last sample pointing into it is gone.
#include "server/ingest/staging_arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace packfeed::server {
namespace {

constexpr uint64_t kAlign = ExtentAllocator::kExtentAlignment;

TEST(ExtentAllocatorTest, FirstFitFromTheLowestAddressAligned) {
  ExtentAllocator spans(10 * kAlign);
  EXPECT_EQ(spans.Allocate(1), 0u);
  EXPECT_EQ(spans.Allocate(kAlign + 1), kAlign);  // rounded up to two units
  EXPECT_EQ(spans.Allocate(kAlign), 3 * kAlign);
  EXPECT_EQ(spans.free_bytes(), 6 * kAlign);
  EXPECT_EQ(spans.Allocate(0), std::nullopt);
  EXPECT_EQ(spans.Allocate(7 * kAlign), std::nullopt);
  EXPECT_EQ(spans.Allocate(6 * kAlign), 4 * kAlign);
  EXPECT_EQ(spans.Allocate(1), std::nullopt);
}

TEST(ExtentAllocatorTest, FreedNeighboursMergeAndAreTakenAgainFirst) {
  ExtentAllocator spans(8 * kAlign);
  const uint64_t a = *spans.Allocate(2 * kAlign);
  const uint64_t b = *spans.Allocate(2 * kAlign);
  const uint64_t c = *spans.Allocate(2 * kAlign);
  spans.Free(a, 2 * kAlign);
  spans.Free(c, 2 * kAlign);
  // Holes of 2, 2 (+2 at the end, merged with c's): 4 does not fit below b.
  EXPECT_EQ(spans.Allocate(4 * kAlign), c);
  spans.Free(c, 4 * kAlign);
  spans.Free(b, 2 * kAlign);  // joins a's hole and c's
  EXPECT_EQ(spans.free_bytes(), 8 * kAlign);
  EXPECT_EQ(spans.Allocate(8 * kAlign), 0u);
}

// A producer's own placement (a put in one call): the span it names is
// taken only when free whole and on the grid, splitting the free span
// around it.
TEST(ExtentAllocatorTest, ASpanIsTakenWhereItIsNamedOnlyWhenFreeWhole) {
  ExtentAllocator spans(10 * kAlign);
  ASSERT_EQ(spans.Allocate(2 * kAlign), 0u);
  EXPECT_FALSE(spans.IsFree(kAlign, kAlign));          // taken
  EXPECT_FALSE(spans.IsFree(kAlign, 2 * kAlign));      // partly taken
  EXPECT_FALSE(spans.IsFree(3 * kAlign + 8, 1));       // off the grid
  EXPECT_FALSE(spans.IsFree(9 * kAlign, kAlign + 1));  // past the end once rounded up
  EXPECT_FALSE(spans.IsFree(4 * kAlign, 0));
  EXPECT_FALSE(spans.AllocateAt(kAlign, kAlign));
  EXPECT_EQ(spans.free_bytes(), 8 * kAlign);

  ASSERT_TRUE(spans.IsFree(4 * kAlign, kAlign + 1));
  ASSERT_TRUE(spans.AllocateAt(4 * kAlign, kAlign + 1));  // two units
  const std::map<uint64_t, uint64_t> expected = {{2 * kAlign, 2 * kAlign},
                                                 {6 * kAlign, 4 * kAlign}};
  EXPECT_EQ(spans.free_spans(), expected);
  EXPECT_FALSE(spans.AllocateAt(5 * kAlign, kAlign));
  spans.Free(4 * kAlign, kAlign + 1);
  const std::map<uint64_t, uint64_t> merged = {{2 * kAlign, 8 * kAlign}};
  EXPECT_EQ(spans.free_spans(), merged);
}

TEST(ExtentAllocatorTest, AnArenaSmallerThanOneUnitHasNoSpan) {
  ExtentAllocator spans(kAlign - 1);
  EXPECT_EQ(spans.free_bytes(), 0u);
  EXPECT_EQ(spans.Allocate(1), std::nullopt);
}

TEST(StagingArenaTest, ASpanReturnsWhenItsLastSampleGoes) {
  auto memory = transport::SharedRing::Create(4 * kAlign);
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto arena = std::make_shared<StagingArena>(
      7, std::make_shared<transport::SharedRing>(*std::move(memory)), transport::PeerIdentity{});
  std::shared_ptr<ArenaSpan> span = arena->Take(3 * kAlign);
  ASSERT_NE(span, nullptr);
  EXPECT_EQ(span->data(), arena->data());
  std::memcpy(span->data(), "tokens", 6);
  EXPECT_EQ(arena->Take(2 * kAlign), nullptr);  // one unit left
  std::shared_ptr<const char[]> sample(span, span->data());
  span.reset();
  EXPECT_EQ(arena->Take(2 * kAlign), nullptr);  // the sample holds it
  EXPECT_EQ(std::memcmp(sample.get(), "tokens", 6), 0);
  sample.reset();
  EXPECT_NE(arena->Take(4 * kAlign), nullptr);
}

// A put's answer names at most so many free spans, the lowest first.
TEST(StagingArenaTest, FreeSpansAreTheLowestFew) {
  auto memory = transport::SharedRing::Create(8 * kAlign);
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto arena = std::make_shared<StagingArena>(
      7, std::make_shared<transport::SharedRing>(*std::move(memory)), transport::PeerIdentity{});
  std::vector<std::shared_ptr<ArenaSpan>> units;
  for (int unit = 0; unit < 8; ++unit) {
    units.push_back(arena->Take(kAlign));
    ASSERT_NE(units.back(), nullptr);
  }
  for (int unit = 0; unit < 8; unit += 2) units[unit].reset();  // free: 0, 2, 4, 6
  using Spans = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(arena->FreeSpans(2), (Spans{{0, kAlign}, {2 * kAlign, kAlign}}));
  EXPECT_EQ(arena->FreeSpans(64).size(), 4u);
  EXPECT_TRUE(arena->FreeSpans(0).empty());
}

}  // namespace
}  // namespace packfeed::server
