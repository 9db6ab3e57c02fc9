#include "packfeed/scheduler/cost_model.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::scheduler {
namespace {

TEST(CostModelTest, NamesAreTheOnlyOnes) {
  absl::StatusOr<CostModel> megatron = CostModelFromName("megatron");
  ASSERT_TRUE(megatron.ok());
  EXPECT_EQ(megatron->Cost(100, 2), 100.0 * 100.0 / 2);
  EXPECT_FALSE(megatron->ModelsOverheads());
  for (const char* preset : {"llama1b", "llama8b", "llama70b"}) {
    absl::StatusOr<CostModel> model = CostModelFromName(preset);
    ASSERT_TRUE(model.ok()) << preset;
    EXPECT_TRUE(model->ModelsOverheads()) << preset;
    EXPECT_EQ(model->Cost(4096, 4), Calibrate(*ModelPreset(preset), {}, {}).Cost(4096, 4));
  }
  absl::StatusOr<CostModel> unknown = CostModelFromName("gpt5");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), ::testing::HasSubstr(kCostModelNames));
}

TEST(CostModelTest, CalibrationCountsTrainingFlopsAndTheRing) {
  // A toy shape whose terms are easy to count by hand: h 8, 2 heads of 4,
  // 1 KV head (kv 4), FFN 16 gated, vocab 10, 2 layers; 1 TFLOP/s, 1 GB/s.
  const ModelShape shape{2, 8, 2, 1, 16, 10, true};
  const Hardware hardware{1.0, 1.0, 5.0, 0.5, 2.0};
  const CostModel model = Calibrate(shape, hardware, {});
  const double flops = 1e12;
  EXPECT_DOUBLE_EQ(model.alpha, 3 * 2 * 8 * 2 / flops);
  // Per layer: QKV 2·8·(8 + 8), out 2·8·8, MLP 2·3·8·16; logits 2·8·10.
  EXPECT_DOUBLE_EQ(model.beta, 3 * (2 * (256 + 128 + 768) + 160) / flops);
  // K and V of 4 values, bf16: 16 bytes per token per layer, 3 passes, half exposed.
  EXPECT_DOUBLE_EQ(model.kappa, 0.5 * 3 * 2 * 16 / 1e9);
  EXPECT_DOUBLE_EQ(model.lambda, 3 * 2 * 5e-6);
  EXPECT_DOUBLE_EQ(model.microbatch, 2e-3);
  EXPECT_EQ(model.bubble, 0.0);

  // TP divides compute and K/V bytes; PP divides layers and drops the
  // logits from the per-stage figure; VPP shrinks the bubble.
  const CostModel split = Calibrate(shape, hardware, {2, 2, 3});
  EXPECT_DOUBLE_EQ(split.alpha, model.alpha / 4);
  EXPECT_DOUBLE_EQ(split.beta, 3 * (256 + 128 + 768) / (2 * flops));
  EXPECT_DOUBLE_EQ(split.kappa, model.kappa / 4);
  EXPECT_DOUBLE_EQ(split.lambda, model.lambda / 2);
  EXPECT_DOUBLE_EQ(split.bubble, 1.0 / 3);
}

TEST(CostModelTest, Llama8bTakesAboutASecondPer8kTokensOnAnH100) {
  // 6 · 8e9 parameters · 8 192 tokens ≈ 4e14 FLOPs at 400 TFLOP/s: ~1 s.
  const CostModel model = *CostModelFromName("llama8b");
  EXPECT_NEAR(model.Cost(8192, 1), 1.05, 0.1);
  // A 400-token message split 16 ways costs the group more than on one
  // rank; a 64k sequence still gains from CP.
  EXPECT_GT(16 * model.Cost(400, 16), model.Cost(400, 1));
  EXPECT_LT(model.Cost(65536, 8), model.Cost(65536, 4));
  EXPECT_THAT(DescribeCostModel(model), ::testing::HasSubstr("kappa="));
}

}  // namespace
}  // namespace packfeed::scheduler
