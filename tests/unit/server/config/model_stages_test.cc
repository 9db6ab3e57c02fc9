#include "server/config/model_stages.h"

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "packfeed/v1/config.pb.h"

namespace packfeed::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::ModelLayers Model(const std::string& text) {
  v1::ModelLayers model;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &model)) << text;
  return model;
}

absl::StatusOr<ModelStages> Stages(const std::string& text, int pp, int vpp = 1) {
  return ModelStages::Create(Model(text), pp, vpp, "job");
}

TEST(ModelStagesTest, EvenSplitWithoutVpp) {
  absl::StatusOr<ModelStages> stages = Stages("num_layers: 8", 4);
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_THAT(stages->Layers(2, 0), ElementsAre(IndexRange{4, 6}));
  EXPECT_THAT(stages->MoeEntries(3, 0), ElementsAre(IndexRange{6, 8}));
  EXPECT_EQ(stages->num_moe_layers(), 8);
  EXPECT_EQ(stages->mtp_stage(), -1);
}

// Megatron's get_transformer_layer_offset: first and last stage counts,
// the rest evenly over the middle stages.
TEST(ModelStagesTest, UnevenFirstAndLastStages) {
  absl::StatusOr<ModelStages> stages = Stages(
      "num_layers: 10 num_layers_in_first_pipeline_stage: 1 num_layers_in_last_pipeline_stage: 3",
      4);
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_THAT(stages->Layers(0, 0), ElementsAre(IndexRange{0, 1}));
  EXPECT_THAT(stages->Layers(1, 0), ElementsAre(IndexRange{1, 4}));
  EXPECT_THAT(stages->Layers(2, 0), ElementsAre(IndexRange{4, 7}));
  EXPECT_THAT(stages->Layers(3, 0), ElementsAre(IndexRange{7, 10}));
}

// Under VPP the chunks are laid out chunk-major: chunk 0 of every stage,
// then chunk 1; with uneven stages each stage's count splits over chunks.
TEST(ModelStagesTest, VirtualChunksAreChunkMajor) {
  absl::StatusOr<ModelStages> even = Stages("num_layers: 8", 2, 2);
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_THAT(even->Layers(0, 0), ElementsAre(IndexRange{0, 2}));
  EXPECT_THAT(even->Layers(1, 0), ElementsAre(IndexRange{2, 4}));
  EXPECT_THAT(even->Layers(0, 1), ElementsAre(IndexRange{4, 6}));
  EXPECT_THAT(even->Layers(1, 1), ElementsAre(IndexRange{6, 8}));
  absl::StatusOr<ModelStages> uneven = Stages(
      "num_layers: 10 num_layers_in_first_pipeline_stage: 2 num_layers_in_last_pipeline_stage: 4",
      3, 2);
  ASSERT_TRUE(uneven.ok()) << uneven.status();
  // Per chunk: 1 (first), 2 (middle), 2 (last) = 5 layers.
  EXPECT_THAT(uneven->Layers(0, 1), ElementsAre(IndexRange{5, 6}));
  EXPECT_THAT(uneven->Layers(1, 1), ElementsAre(IndexRange{6, 8}));
  EXPECT_THAT(uneven->Layers(2, 0), ElementsAre(IndexRange{3, 5}));
}

TEST(ModelStagesTest, DenseLayersHaveNoEntriesAndMtpLayersDo) {
  // Layers 0-5 decoder (0, 1 dense), 6 the MTP layer on the middle stage.
  absl::StatusOr<ModelStages> stages =
      Stages("num_layers: 6 dense_layers: [0, 1] mtp_num_layers: 1 mtp_stage: 1", 3);
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_EQ(stages->num_moe_layers(), 5);
  EXPECT_EQ(stages->mtp_stage(), 1);
  EXPECT_TRUE(stages->MoeEntries(0, 0).empty());  // both dense
  EXPECT_THAT(stages->Layers(1, 0), ElementsAre(IndexRange{2, 4}, IndexRange{6, 7}));
  EXPECT_THAT(stages->MoeEntries(1, 0), ElementsAre(IndexRange{0, 2}, IndexRange{4, 5}));
  EXPECT_THAT(stages->MoeEntries(2, 0), ElementsAre(IndexRange{2, 4}));
  // On the last stage (the default) MTP follows the last decoder layers.
  absl::StatusOr<ModelStages> last = Stages("num_layers: 4 mtp_num_layers: 1", 2);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_THAT(last->MoeEntries(1, 0), ElementsAre(IndexRange{2, 5}));
}

TEST(ModelStagesTest, LayerCountsThatDoNotAddUpAreRefused) {
  EXPECT_THAT(Stages("num_layers: 9", 2).status().message(),
              HasSubstr("9 layers do not split evenly over 2 pipeline stages"));
  EXPECT_THAT(Stages("num_layers: 8 num_layers_in_first_pipeline_stage: 5 "
                     "num_layers_in_last_pipeline_stage: 5",
                     3)
                  .status()
                  .message(),
              HasSubstr("fewer than the first and last stages' 5 + 5"));
  EXPECT_THAT(Stages("num_layers: 8 num_layers_in_first_pipeline_stage: 3 "
                     "num_layers_in_last_pipeline_stage: 3",
                     2)
                  .status()
                  .message(),
              HasSubstr("8 layers, but the first and last stages hold 6"));
  EXPECT_THAT(
      Stages("num_layers: 6 num_layers_in_first_pipeline_stage: 3", 2, 2).status().message(),
      HasSubstr("stage 0's 3 layers do not split evenly over 2 model chunks"));
  EXPECT_THAT(Stages("num_layers: 4 mtp_num_layers: 1 mtp_stage: 2", 2).status().message(),
              HasSubstr("job.model.mtp_stage: 2 is outside 2 pipeline stages"));
  EXPECT_THAT(Stages("num_layers: 4 dense_layers: [1, 1]", 1).status().message(),
              HasSubstr("listed twice"));
  EXPECT_THAT(Stages("num_layers: 4 dense_layers: 4", 1).status().message(),
              HasSubstr("outside the model's 4"));
  EXPECT_THAT(Stages("num_layers: 4 num_layers_in_first_pipeline_stage: 1", 1).status().message(),
              HasSubstr("uneven stages need topology.pp > 1"));
}

}  // namespace
}  // namespace packfeed::server
