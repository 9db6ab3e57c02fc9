#include "server/pipeline/pack.h"

#include <atomic>
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pack_read_back.h"

namespace packfeed::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

dataset::SampleRules Varlen() { return {dataset::SampleKind::kVarlen, 8, 99, 98, false}; }
dataset::SampleRules Sft() { return {dataset::SampleKind::kSft, 8, 99, 98, false}; }

TEST(PackTest, VarlenZeroesPadSlotsAndRestartsPositions) {
  const std::vector<int64_t> a = {10, 11, 12, 99};  // real 3
  const std::vector<int64_t> b = {20, 99};          // real 1
  scheduler::CpGroup group{0, 1, {{0, 3, 4}, {1, 1, 2}}};
  const std::vector<absl::Span<const int64_t>> runs = {a, b};
  absl::StatusOr<PackedMicrobatch> packed = PackMicrobatch(group, runs, 0, Varlen());
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_THAT(packed->tokens, ElementsAre(10, 11, 12, 0, 20, 0));
  EXPECT_THAT(packed->labels, ElementsAre(11, 12, 99, 0, 99, 0));
  EXPECT_THAT(packed->loss_mask, ElementsAre(1, 1, 1, 0, 1, 0));
  EXPECT_THAT(packed->position_ids, ElementsAre(0, 1, 2, 0, 0, 0));
  EXPECT_THAT(packed->padding_mask, ElementsAre(0, 0, 0, 1, 0, 1));
  EXPECT_THAT(packed->cu_seqlens, ElementsAre(0, 3, 4));
  EXPECT_THAT(packed->cu_seqlens_padded, ElementsAre(0, 4, 6));
  EXPECT_EQ(packed->max_seqlen, 4);
}

TEST(PackTest, SftKeepsPadIdsAndMasksPadLabels) {
  const std::vector<int64_t> a = {10, 11, 99};  // EOD is an input here
  scheduler::CpGroup group{0, 1, {{0, 4, 4}}};  // Megatron: real = padded
  const std::vector<absl::Span<const int64_t>> runs = {a};
  absl::StatusOr<PackedMicrobatch> packed = PackMicrobatch(group, runs, 0, Sft());
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_THAT(packed->tokens, ElementsAre(10, 11, 99, 98));
  EXPECT_THAT(packed->labels, ElementsAre(11, 99, 98, 98));
  EXPECT_THAT(packed->loss_mask, ElementsAre(1, 1, 0, 0));
  EXPECT_THAT(packed->position_ids, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(packed->padding_mask, ElementsAre(0, 0, 0, 0));
}

dataset::SampleRules Pretraining(bool reset_positions, bool eod_mask) {
  dataset::SampleRules rules{dataset::SampleKind::kPretraining, 8, 99, -1, false};
  rules.reset_position_ids = reset_positions;
  rules.eod_mask_loss = eod_mask;
  return rules;
}

// GPTDataset.__getitem__: tokens text[:-1], labels text[1:], positions
// restarting after an EOD input, the loss masked at EOD inputs.
TEST(PackTest, PretrainingFollowsMegatronsGetItem) {
  const std::vector<int64_t> text = {10, 11, 99, 12, 13, 99, 14, 15, 16};  // seq 8 + 1
  scheduler::CpGroup group{0, 1, {{0, 8, 8}}};
  const std::vector<absl::Span<const int64_t>> runs = {text};
  absl::StatusOr<PackedMicrobatch> plain =
      PackMicrobatch(group, runs, 0, Pretraining(false, false));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(plain->tokens, ElementsAre(10, 11, 99, 12, 13, 99, 14, 15));
  EXPECT_THAT(plain->labels, ElementsAre(11, 99, 12, 13, 99, 14, 15, 16));
  EXPECT_THAT(plain->loss_mask, ElementsAre(1, 1, 1, 1, 1, 1, 1, 1));
  EXPECT_THAT(plain->position_ids, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  absl::StatusOr<PackedMicrobatch> reset = PackMicrobatch(group, runs, 0, Pretraining(true, true));
  ASSERT_TRUE(reset.ok());
  EXPECT_THAT(reset->loss_mask, ElementsAre(1, 1, 0, 1, 1, 0, 1, 1));
  EXPECT_THAT(reset->position_ids, ElementsAre(0, 1, 2, 0, 1, 2, 0, 1));
  // CP 2: rank 1 holds parts 1 and 2 of 4, positions counted from the
  // sample's last EOD before each part.
  scheduler::CpGroup cp2{0, 2, {{0, 8, 8}}};
  absl::StatusOr<PackedMicrobatch> rank1 = PackMicrobatch(cp2, runs, 1, Pretraining(true, true));
  ASSERT_TRUE(rank1.ok());
  EXPECT_THAT(rank1->tokens, ElementsAre(99, 12, 13, 99));
  EXPECT_THAT(rank1->position_ids, ElementsAre(2, 0, 1, 2));
}

// A partial last sample (kept validation samples): padded with Megatron's
// pad (-1), served as 0 and not trained.
TEST(PackTest, PretrainingPartialSampleIsPaddedAndMasked) {
  const std::vector<int64_t> text = {10, 11, 12, 13, 14};
  scheduler::CpGroup group{0, 1, {{0, 8, 8}}};
  const std::vector<absl::Span<const int64_t>> runs = {text};
  absl::StatusOr<PackedMicrobatch> packed =
      PackMicrobatch(group, runs, 0, Pretraining(false, false));
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_THAT(packed->tokens, ElementsAre(10, 11, 12, 13, 14, 0, 0, 0));
  EXPECT_THAT(packed->labels, ElementsAre(11, 12, 13, 14, 0, 0, 0, 0));
  EXPECT_THAT(packed->loss_mask, ElementsAre(1, 1, 1, 1, 0, 0, 0, 0));
  EXPECT_THAT(packed->padding_mask, ElementsAre(0, 0, 0, 0, 0, 1, 1, 1));
}

TEST(PackTest, ZigzagGivesRankKPartsKAnd2cMinus1MinusK) {
  std::vector<int64_t> run(9);
  for (int i = 0; i < 9; ++i) run[i] = 100 + i;  // real 8, padded 8, c = 2: parts of 2
  scheduler::CpGroup group{4, 2, {{7, 8, 8}}};
  const std::vector<absl::Span<const int64_t>> runs = {run};
  absl::StatusOr<PackedMicrobatch> rank0 = PackMicrobatch(group, runs, 0, Varlen());
  absl::StatusOr<PackedMicrobatch> rank1 = PackMicrobatch(group, runs, 1, Varlen());
  ASSERT_TRUE(rank0.ok() && rank1.ok());
  EXPECT_THAT(rank0->tokens, ElementsAre(100, 101, 106, 107));
  EXPECT_THAT(rank1->tokens, ElementsAre(102, 103, 104, 105));
  EXPECT_THAT(rank1->position_ids, ElementsAre(2, 3, 4, 5));
  // Metadata is global, identical on both ranks.
  EXPECT_EQ(rank0->cu_seqlens_padded, rank1->cu_seqlens_padded);
  EXPECT_THAT(rank0->cu_seqlens_padded, ElementsAre(0, 8));
}

TEST(PackTest, RefusesWhatCannotBePacked) {
  const std::vector<int64_t> run = {1, 2, 3, 99};
  const std::vector<absl::Span<const int64_t>> runs = {run};
  EXPECT_THAT(PackMicrobatch({0, 2, {{0, 3, 6}}}, runs, 0, Varlen()).status().message(),
              HasSubstr("does not split into 4 parts"));
  EXPECT_THAT(PackMicrobatch({0, 2, {{0, 3, 8}}}, runs, 2, Varlen()).status().message(),
              HasSubstr("outside a group"));
  EXPECT_THAT(PackMicrobatch({0, 1, {{0, 5, 8}}}, runs, 0, Varlen()).status().message(),
              HasSubstr("run of 4 tokens"));
}

// A middle pipeline stage gets neither inputs nor targets: they are not
// in its slot, and what is there is written whole over whatever the slot
// held before (the ring's slots are reused).
TEST(PackTest, AMiddleStageSlotHoldsOnlyItsFieldsWrittenWhole) {
  const std::vector<int64_t> a = {10, 11, 12, 99};
  scheduler::CpGroup group{0, 1, {{0, 3, 4}}};
  const std::vector<absl::Span<const int64_t>> runs = {a};
  absl::StatusOr<MicrobatchSource> source = SourceOfGroup(group, runs, 0, Varlen());
  ASSERT_TRUE(source.ok()) << source.status();
  source->stage = FieldsOfStage(1, 3);
  std::vector<std::string> names;
  for (const transport::FieldSpec& spec : MicrobatchSpecs(*source)) names.push_back(spec.name);
  EXPECT_THAT(names, ElementsAre("padding_mask", "cu_seqlens", "cu_seqlens_padded", "max_seqlen"));
  absl::StatusOr<std::vector<transport::FieldDescriptor>> layout =
      transport::LayoutFields(MicrobatchSpecs(*source), 4096);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<uint8_t> slot(4096, 0xEE);
  WriteMicrobatch(*source, *layout, slot.data());
  const uint8_t* padding = slot.data() + (*layout)[0].offset;
  EXPECT_THAT(std::vector<uint8_t>(padding, padding + 4), ElementsAre(0, 0, 0, 1));
  int32_t cu[2];
  std::memcpy(cu, slot.data() + (*layout)[2].offset, sizeof(cu));
  EXPECT_THAT(cu, ElementsAre(0, 4));
  EXPECT_TRUE(ReadBack(*source).tokens.empty());
}

TEST(PackTest, StagesGetTheirFields) {
  EXPECT_TRUE(FieldsOfStage(0, 1).inputs && FieldsOfStage(0, 1).targets);
  EXPECT_TRUE(FieldsOfStage(0, 3).inputs && !FieldsOfStage(0, 3).targets);
  EXPECT_TRUE(!FieldsOfStage(1, 3).inputs && !FieldsOfStage(1, 3).targets);
  EXPECT_TRUE(!FieldsOfStage(2, 3).inputs && FieldsOfStage(2, 3).targets);
  // An MTP stage gets everything, even in the middle.
  EXPECT_TRUE(FieldsOfStage(1, 3, 1).inputs && FieldsOfStage(1, 3, 1).targets);
}

// Side fields: int16 values, 2 layers × 2 per token, stored row r of a
// document holding 10·(document) + r in every entry of layer l plus 100·l.
std::vector<int16_t> Rows(int document, int tokens, int layers, int top_k) {
  std::vector<int16_t> out;
  for (int r = 0; r < tokens; ++r) {
    for (int l = 0; l < layers; ++l) {
      for (int k = 0; k < top_k; ++k)
        out.push_back(static_cast<int16_t>(10 * document + r + 100 * l));
    }
  }
  return out;
}

absl::Span<const char> Bytes(const std::vector<int16_t>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * 2};
}

std::vector<int16_t> Values(const PackedMicrobatch::Side& side) {
  std::vector<int16_t> out(side.bytes.size() / 2);
  std::memcpy(out.data(), side.bytes.data(), side.bytes.size());
  return out;
}

SideFieldInfo Int16Field(bool labels, std::vector<int64_t> inner) {
  SideFieldInfo field;
  field.name = "f";
  field.type = transport::ElementType::kInt16;
  field.element_bytes = 2;
  field.inner_shape = inner;
  field.row_elements = 1;
  for (int64_t e : inner) field.row_elements *= e;
  const int16_t pad = -1;
  field.pad.resize(2);
  std::memcpy(field.pad.data(), &pad, 2);
  field.labels_aligned = labels;
  field.layer_axis = !inner.empty();
  return field;
}

TEST(PackTest, SideFieldFollowsTokensOrLabelsWithPadsAndZigzag) {
  std::vector<int64_t> run(9);
  for (int i = 0; i < 9; ++i) run[i] = 100 + i;        // stored 9 tokens, real 8
  const std::vector<int16_t> rows = Rows(0, 9, 1, 1);  // value r at row r
  scheduler::CpGroup group{0, 2, {{0, 6, 8}}};         // real 6 of 8 (truncated run view)
  const std::vector<absl::Span<const int64_t>> runs = {run};
  for (bool labels : {false, true}) {
    const SideFieldInfo field = Int16Field(labels, {});
    const SideSlice slice{&field, "f", {}};
    const std::vector<SideRun> sides = {{slice, {Bytes(rows)}, {}}};
    absl::StatusOr<PackedMicrobatch> rank1 = PackMicrobatch(group, runs, 1, Varlen(), sides);
    ASSERT_TRUE(rank1.ok()) << rank1.status();
    ASSERT_EQ(rank1->side.size(), 1u);
    // Rank 1 of 2 holds positions 2, 3, 4, 5 (parts 1 and 2); all real.
    EXPECT_THAT(Values(rank1->side[0]), labels ? ElementsAre(3, 4, 5, 6) : ElementsAre(2, 3, 4, 5));
    absl::StatusOr<PackedMicrobatch> rank0 = PackMicrobatch(group, runs, 0, Varlen(), sides);
    ASSERT_TRUE(rank0.ok());
    // Rank 0: positions 0, 1 and 6, 7, which are pad slots.
    EXPECT_THAT(Values(rank0->side[0]),
                labels ? ElementsAre(1, 2, -1, -1) : ElementsAre(0, 1, -1, -1));
  }
}

TEST(PackTest, LayerAxisIsCutToTheSliceAndLabelsPastTheStoredRowsArePads) {
  // A document of 3 stored tokens + an appended EOD: real 3.
  const std::vector<int64_t> run = {5, 6, 7, 99};
  const std::vector<int16_t> rows = Rows(1, 3, 4, 2);
  const SideFieldInfo field = Int16Field(true, {4, 2});
  const SideSlice slice{&field, "f", {{1, 2}, {3, 4}}};  // layers 1 and 3
  const std::vector<SideRun> sides = {{slice, {Bytes(rows)}, {}}};
  scheduler::CpGroup group{0, 1, {{0, 3, 4}}};
  const std::vector<absl::Span<const int64_t>> runs = {run};
  absl::StatusOr<PackedMicrobatch> packed = PackMicrobatch(group, runs, 0, Varlen(), sides);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_THAT(packed->side[0].inner_shape, ElementsAre(2, 2));
  // Positions 0, 1 hold rows 1, 2; position 2's label is the appended EOD
  // (no stored row) and position 3 a pad slot.
  EXPECT_THAT(Values(packed->side[0]),
              ElementsAre(111, 111, 311, 311, 112, 112, 312, 312, -1, -1, -1, -1, -1, -1, -1, -1));
}

// A uint8 loss mask, value j + 1 for position j (0 = not trained).
SideFieldInfo LossMaskField() {
  SideFieldInfo field;
  field.name = "mask";
  field.labels_aligned = true;
  field.loss_mask = true;
  field.pad = {0};
  return field;
}

TEST(PackTest, LossMaskFieldReplacesTheDefaultMask) {
  const std::vector<int64_t> run = {1, 2, 3, 4, 99};  // real 4
  const std::vector<uint8_t> mask = {0, 0, 1, 1, 1};  // a prompt of 2 tokens
  const SideFieldInfo field = LossMaskField();
  const SideSlice slice{&field, "mask", {}};
  const std::vector<SideRun> sides = {
      {slice, {{reinterpret_cast<const char*>(mask.data()), mask.size()}}, {}}};
  scheduler::CpGroup group{0, 1, {{0, 4, 6}}};
  const std::vector<absl::Span<const int64_t>> runs = {run};
  absl::StatusOr<PackedMicrobatch> packed = PackMicrobatch(group, runs, 0, Varlen(), sides);
  ASSERT_TRUE(packed.ok()) << packed.status();
  // Position j trains label j + 1: the prompt's second token is a label
  // of position 0 only.
  EXPECT_THAT(packed->loss_mask, ElementsAre(0, 1, 1, 1, 0, 0));
  EXPECT_TRUE(packed->side.empty());  // not served by name
}

// A microbatch past kSplitBytes is written by several threads in portions cut
// inside sequences; every byte equals the one-thread write, side rows cut to
// a layer slice and shifted to labels, the loss mask and pads included.
TEST(PackTest, WorkersWriteALargeMicrobatchByteForByteAsOneThread) {
  constexpr int kSequences = 7;
  std::vector<std::vector<int64_t>> texts;
  std::vector<std::vector<int16_t>> rows;
  std::vector<std::vector<uint8_t>> masks;
  scheduler::CpGroup group{0, 2, {}};
  int64_t positions = 0;
  for (int i = 0; i < kSequences; ++i) {
    const int real = 9000 + 3001 * i;               // a chunk boundary inside most
    const int64_t padded = (real + 3) / 4 * 4 + 4;  // splits in 4 parts for CP 2
    texts.emplace_back(static_cast<size_t>(real) + 1);
    for (int t = 0; t <= real; ++t) texts.back()[static_cast<size_t>(t)] = 1000 * i + t;
    rows.push_back(Rows(i, real - 5, 4, 2));  // fewer rows than tokens: pads
    masks.emplace_back(static_cast<size_t>(real) + 1, 1);
    masks.back()[3] = 0;
    group.sequences.push_back({i, real, padded});
    positions += padded / 2;
  }
  const SideFieldInfo field = Int16Field(true, {4, 2});
  const SideSlice slice{&field, "f", {{1, 2}, {3, 4}}};
  const SideFieldInfo mask_field = LossMaskField();
  const SideSlice mask_slice{&mask_field, "mask", {}};
  std::vector<absl::Span<const int64_t>> runs;
  std::vector<SideRun> sides = {{slice, {}, {}}, {mask_slice, {}, {}}};
  for (int i = 0; i < kSequences; ++i) {
    runs.push_back(texts[static_cast<size_t>(i)]);
    sides[0].rows.push_back(Bytes(rows[static_cast<size_t>(i)]));
    sides[1].rows.push_back({reinterpret_cast<const char*>(masks[static_cast<size_t>(i)].data()),
                             masks[static_cast<size_t>(i)].size()});
  }
  for (int cp_rank : {0, 1}) {
    absl::StatusOr<MicrobatchSource> source = SourceOfGroup(group, runs, cp_rank, Varlen(), sides);
    ASSERT_TRUE(source.ok()) << source.status();
    auto layout = transport::LayoutFields(MicrobatchSpecs(*source), UINT64_MAX);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const uint64_t bytes = layout->back().offset + layout->back().bytes;
    ASSERT_GE(bytes, kSplitBytes);
    ASSERT_GT(positions, 3 * kPortionPositions);
    std::vector<uint8_t> one(bytes, 0xAB);
    std::vector<uint8_t> many(bytes, 0xCD);
    WriteMicrobatch(*source, *layout, one.data());
    PackWorkers workers(3);
    WriteMicrobatch(*source, *layout, many.data(), &workers);
    // Only what the layout places is written; compare those bytes.
    for (const transport::FieldDescriptor& f : *layout) {
      EXPECT_EQ(std::memcmp(one.data() + f.offset, many.data() + f.offset, f.bytes), 0)
          << "cp rank " << cp_rank << ", field at " << f.offset;
    }
  }
}

// Side rows read straight into the slot (SideRun::in_file): the slot holds
// the pads at once, and after the reads, as Storage::ReadInto does them,
// every byte of the write from rows in memory. Here "document" i is
// sequence i's rows and each read is served from them.
TEST(PackTest, SideRowsReadIntoTheSlotGiveTheBytesOfRowsInMemory) {
  constexpr int kSequences = 5;
  std::vector<std::vector<int64_t>> texts;
  scheduler::CpGroup group{0, 2, {}};
  for (int i = 0; i < kSequences; ++i) {
    const int real = 20000 + 3001 * i;
    texts.emplace_back(static_cast<size_t>(real) + 1, 7 * i);
    group.sequences.push_back({i, real, (real + 3) / 4 * 4 + 4});
  }
  const SideFieldInfo layers = Int16Field(true, {4, 2});
  const SideFieldInfo scalar = Int16Field(false, {});
  // Whole [4, 2] rows, the same cut to layers 1 and 3, one value a token.
  for (const SideSlice& slice :
       {SideSlice{&layers, "f", {}}, SideSlice{&layers, "f", {{1, 2}, {3, 4}}},
        SideSlice{&scalar, "f", {}}}) {
    const bool per_token = slice.field->inner_shape.empty();
    std::vector<std::vector<int16_t>> rows;
    for (int i = 0; i < kSequences; ++i) {  // fewer rows than tokens: pads
      rows.push_back(Rows(i, static_cast<int>(group.sequences[i].length) - 5, per_token ? 1 : 4,
                          per_token ? 1 : 2));
    }
    std::vector<absl::Span<const int64_t>> runs;
    std::vector<SideRun> in_memory = {{slice, {}, {}}};
    std::vector<SideRun> in_file = {{slice, {}, {}}};
    for (int i = 0; i < kSequences; ++i) {
      runs.push_back(texts[static_cast<size_t>(i)]);
      in_memory[0].rows.push_back(Bytes(rows[static_cast<size_t>(i)]));
      SampleNeed stored;
      stored.document = i;
      stored.bytes = in_memory[0].rows.back().size();
      stored.tokens = false;
      in_file[0].in_file.push_back(stored);
    }
    for (int cp_rank : {0, 1}) {
      auto from_memory = SourceOfGroup(group, runs, cp_rank, Varlen(), in_memory);
      auto from_file = SourceOfGroup(group, runs, cp_rank, Varlen(), in_file);
      ASSERT_TRUE(from_memory.ok() && from_file.ok());
      auto layout = transport::LayoutFields(MicrobatchSpecs(*from_memory), UINT64_MAX);
      ASSERT_TRUE(layout.ok());
      const uint64_t bytes = layout->back().offset + layout->back().bytes;
      std::vector<uint8_t> expected(bytes, 0), slot(bytes, 0);
      WriteMicrobatch(*from_memory, *layout, expected.data());
      PackWorkers workers(3);
      std::vector<SlotRead> reads;
      WriteMicrobatch(*from_file, *layout, slot.data(), &workers, &reads);
      ASSERT_FALSE(reads.empty());
      EXPECT_NE(slot, expected) << "the rows were written without being read";
      for (const SlotRead& read : reads) {
        const absl::Span<const char> stored =
            in_memory[0].rows[static_cast<size_t>(read.need.document)];
        ASSERT_LE(read.need.offset + read.need.bytes, stored.size());
        uint8_t* out = read.destination;
        for (uint64_t row = 0; row < read.need.bytes; row += read.row_bytes) {
          const char* from = stored.data() + read.need.offset + row;
          if (read.kept.empty()) {
            out = static_cast<uint8_t*>(std::memcpy(out, from, read.row_bytes)) + read.row_bytes;
          }
          for (const auto& [offset, length] : read.kept) {
            out = static_cast<uint8_t*>(std::memcpy(out, from + offset, length)) + length;
          }
        }
      }
      EXPECT_EQ(slot, expected) << "cp rank " << cp_rank << ", cut " << !slice.entries.empty();
    }
  }
}

TEST(PackWorkersTest, RunsEveryPartOnceAndReturnsWhenAllAreDone) {
  PackWorkers workers(4);
  EXPECT_EQ(workers.threads(), 4);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> calls(37);
    workers.Run(37, [&](int part) { calls[static_cast<size_t>(part)].fetch_add(1); });
    for (const std::atomic<int>& c : calls) ASSERT_EQ(c.load(), 1) << "round " << round;
  }
  PackWorkers alone(1);
  int sum = 0;
  alone.Run(5, [&](int part) { sum += part; });
  EXPECT_EQ(sum, 10);
}

}  // namespace
}  // namespace packfeed::server
