#include "server/pipeline/peer_fill.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace packfeed::server {
namespace {

// A read of `rows` rows of `row_bytes` of document `document` into `slot`
// at `offset`, keeping `kept` of each row (empty: all of it).
SlotRead ReadOf(uint8_t* slot, uint64_t offset, int64_t document, uint64_t rows, uint64_t row_bytes,
                std::vector<std::pair<uint64_t, uint64_t>> kept = {}) {
  SlotRead read;
  read.need.document = document;
  read.need.offset = 64 * static_cast<uint64_t>(document);
  read.need.bytes = rows * row_bytes;
  read.destination = slot + offset;
  read.row_bytes = row_bytes;
  read.kept = std::move(kept);
  return read;
}

TEST(PeerFillTest, RegionsAreWhereEachReadWritesAndWhatItLeaves) {
  std::vector<uint8_t> slot(1024);
  const std::vector<SlotRead> reads = {ReadOf(slot.data(), 0, 1, 10, 8),
                                       ReadOf(slot.data(), 200, 2, 4, 16, {{0, 4}, {8, 2}})};
  EXPECT_EQ(RegionsOf(reads, slot.data()), (SlotRegions{{0, 80}, {200, 24}}));
}

TEST(PeerFillTest, APeerJoinsOnlyWhenItReadsTheSameRowsIntoTheSamePlaces) {
  std::vector<uint8_t> leader(1024), peer(1024);
  const std::vector<SlotRead> reads = {ReadOf(leader.data(), 0, 1, 10, 8),
                                       ReadOf(leader.data(), 100, 2, 4, 8)};
  std::vector<SlotRead> same = {ReadOf(peer.data(), 0, 1, 10, 8),
                                ReadOf(peer.data(), 100, 2, 4, 8)};
  EXPECT_TRUE(SameReads(reads, leader.data(), same, peer.data()));

  std::vector<SlotRead> moved = same;
  moved[1].destination += 8;  // a ring of another slot size lays out otherwise
  EXPECT_FALSE(SameReads(reads, leader.data(), moved, peer.data()));
  std::vector<SlotRead> other_document = same;
  other_document[0].need.document = 7;
  EXPECT_FALSE(SameReads(reads, leader.data(), other_document, peer.data()));
  std::vector<SlotRead> other_offset = same;
  other_offset[0].need.offset += 8;
  EXPECT_FALSE(SameReads(reads, leader.data(), other_offset, peer.data()));
  std::vector<SlotRead> cut = same;
  cut[0].kept = {{0, 8}};  // another stage's layers
  EXPECT_FALSE(SameReads(reads, leader.data(), cut, peer.data()));
  EXPECT_FALSE(SameReads(reads, leader.data(), {same[0]}, peer.data()));
}

TEST(PeerFillTest, CopiesTheRegionsAndNothingElse) {
  std::vector<uint8_t> leader(64), peer(64, 0xee);
  for (size_t i = 0; i < leader.size(); ++i) leader[i] = static_cast<uint8_t>(i);
  CopyRegions({{4, 8}, {40, 2}}, leader.data(), peer.data());
  for (size_t i = 0; i < peer.size(); ++i) {
    const bool copied = (i >= 4 && i < 12) || (i >= 40 && i < 42);
    EXPECT_EQ(peer[i], copied ? leader[i] : 0xee) << "byte " << i;
  }
}

TEST(PeerFillsTest, AFillEndsOnceWithItsRegionsAndThePeersThatWaited) {
  PeerFills fills;
  const FillMember leader{0, 10}, first{1, 11}, second{2, 12}, stranger{3, 13};
  fills.Begin(leader, {{0, 80}, {200, 24}}, {first, second});
  EXPECT_TRUE(fills.InFlight(leader));
  EXPECT_TRUE(fills.InFlight(first));
  EXPECT_TRUE(fills.InFlight(second));
  EXPECT_FALSE(fills.InFlight(stranger));

  std::optional<PeerFills::Ended> ended = fills.End(leader);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->regions, (SlotRegions{{0, 80}, {200, 24}}));
  EXPECT_EQ(ended->peers, (std::vector<FillMember>{first, second}));
  EXPECT_FALSE(fills.InFlight(leader));
  EXPECT_FALSE(fills.InFlight(first));
  EXPECT_FALSE(fills.End(leader).has_value());  // a second completion finds nothing
}

TEST(PeerFillsTest, AWithdrawnFillLeavesItsPeersWaitingOnNothing) {
  PeerFills fills;
  const FillMember leader{0, 10}, peer{1, 11};
  fills.Begin(leader, {{0, 8}}, {peer});
  fills.Withdraw(leader);  // the leader attached again: its reads withdrawn
  EXPECT_FALSE(fills.InFlight(peer));
  EXPECT_FALSE(fills.End(leader).has_value());  // the withdrawn reads' completion
}

TEST(PeerFillsTest, TheLeaderAttachedAgainIsAnotherMember) {
  PeerFills fills;
  const FillMember before{0, 10}, again{0, 20}, peer{1, 11};
  fills.Begin(before, {{0, 8}}, {peer});
  EXPECT_FALSE(fills.InFlight(again));
  EXPECT_FALSE(fills.End(again).has_value());
  EXPECT_TRUE(fills.InFlight(peer));  // the first connection's fill is untouched
  ASSERT_TRUE(fills.End(before).has_value());
}

TEST(PeerFillsTest, APeerOfAnEndedFillMayWaitOnTheNextOne) {
  PeerFills fills;
  const FillMember a{0, 10}, b{2, 12}, peer{1, 11};
  fills.Begin(a, {{0, 8}}, {peer});
  ASSERT_TRUE(fills.End(a).has_value());
  fills.Begin(b, {{0, 8}}, {peer});
  fills.Withdraw(a);  // nothing of a's left: b's peer still waits
  EXPECT_TRUE(fills.InFlight(peer));
  fills.Clear();
  EXPECT_FALSE(fills.InFlight(peer));
  EXPECT_FALSE(fills.InFlight(b));
}

TEST(PeerFillTest, AReadAtOrBeforeTheFurthestOfARankAndStageIsAReread) {
  RereadMarks marks;
  EXPECT_FALSE(marks.Mark(0, 0, {0, 0}));
  EXPECT_FALSE(marks.Mark(0, 0, {0, 1}));
  EXPECT_FALSE(marks.Mark(0, 0, {1, 0}));
  EXPECT_TRUE(marks.Mark(0, 0, {1, 0}));  // the same again
  EXPECT_TRUE(marks.Mark(0, 0, {0, 1}));  // behind
  EXPECT_FALSE(marks.Mark(0, 0, {1, 1}));
  // Other ranks and stages keep their own marks.
  EXPECT_FALSE(marks.Mark(1, 0, {0, 0}));
  EXPECT_FALSE(marks.Mark(0, 1, {0, 0}));
}

}  // namespace
}  // namespace packfeed::server
