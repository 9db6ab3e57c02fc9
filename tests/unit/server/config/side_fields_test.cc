#include "server/config/side_fields.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "packfeed/dataset/indexed_dataset_writer.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/model_stages.h"
#include "test_paths.h"

namespace packfeed::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename Message>
Message Parse(const std::string& text) {
  Message message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

// Two pipeline stages of 4 layers, all with experts.
const ModelStages& Stages() {
  static const ModelStages* stages = new ModelStages(
      *ModelStages::Create(Parse<v1::ModelLayers>("num_layers: 4"), /*pp=*/2, /*vpp=*/1, "job"));
  return *stages;
}

absl::StatusOr<SideFieldInfo> Resolve(const std::string& text) {
  return ResolveSideField(Parse<v1::SideField>(text), Stages(), "job.side_fields[0]");
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<SideFieldInfo> field = Resolve(text);
  EXPECT_TRUE(absl::IsInvalidArgument(field.status())) << text;
  return std::string(field.status().message());
}

TEST(SideFieldsTest, DefaultsFollowTheAlignmentAndTheLayerAxis) {
  absl::StatusOr<SideFieldInfo> experts =
      Resolve("name: 'experts' dtype: 'int16' inner_shape: [4, 2] pad_value: -1 layer_axis: true");
  ASSERT_TRUE(experts.ok()) << experts.status();
  EXPECT_EQ(experts->row_elements, 8);
  EXPECT_EQ(experts->row_bytes(), 16u);
  EXPECT_THAT(experts->pad, ElementsAre(0xff, 0xff));
  EXPECT_EQ(experts->stages, SideFieldStages::kLayers);

  absl::StatusOr<SideFieldInfo> logprobs =
      Resolve("name: 'logprobs' dtype: 'float32' align: ALIGN_LABELS");
  ASSERT_TRUE(logprobs.ok()) << logprobs.status();
  EXPECT_TRUE(logprobs->labels_aligned);
  EXPECT_EQ(logprobs->stages, SideFieldStages::kTargets);
  EXPECT_THAT(logprobs->pad, ElementsAre(0, 0, 0, 0));

  absl::StatusOr<SideFieldInfo> plain = Resolve("name: 'ids' dtype: 'int32'");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->stages, SideFieldStages::kInputs);
}

TEST(SideFieldsTest, SixteenBitFloatPadsAreRoundedToTheirBits) {
  // 1.0 is 0x3c00 in binary16 and 0x3f80 in bfloat16; -2.5 is 0xc100 / 0xc020.
  EXPECT_THAT(Resolve("name: 'h' dtype: 'float16' pad_value: 1")->pad, ElementsAre(0x00, 0x3c));
  EXPECT_THAT(Resolve("name: 'b' dtype: 'bfloat16' pad_value: 1")->pad, ElementsAre(0x80, 0x3f));
  EXPECT_THAT(Resolve("name: 'h' dtype: 'float16' pad_value: -2.5")->pad, ElementsAre(0x00, 0xc1));
  EXPECT_THAT(Resolve("name: 'b' dtype: 'bfloat16' pad_value: -2.5")->pad, ElementsAre(0x20, 0xc0));
  // Past binary16's largest finite value: infinity.
  EXPECT_THAT(Resolve("name: 'h' dtype: 'float16' pad_value: 1e6")->pad, ElementsAre(0x00, 0x7c));
}

TEST(SideFieldsTest, EveryBadFieldIsRefusedNamingWhatIsWrong) {
  EXPECT_THAT(ErrorOf("name: 'a-b' dtype: 'int8'"),
              HasSubstr("job.side_fields[0].name: 'a-b' must be [A-Za-z0-9_]+"));
  EXPECT_THAT(ErrorOf("name: 'a_name_longer_than_24_bytes' dtype: 'int8'"),
              HasSubstr("at most 24 bytes"));
  EXPECT_THAT(ErrorOf("name: 'cu_seqlens' dtype: 'int32'"),
              HasSubstr("'cu_seqlens' is a THD field"));
  EXPECT_THAT(ErrorOf("name: 'x' dtype: 'float64'"),
              HasSubstr(".dtype: 'float64' is not one of int8, uint8"));
  EXPECT_THAT(ErrorOf("name: 'x' dtype: 'int8' inner_shape: [1, 2, 3]"),
              HasSubstr(".inner_shape: at most two dimensions"));
  EXPECT_THAT(ErrorOf("name: 'x' dtype: 'int8' inner_shape: [0]"),
              HasSubstr(".inner_shape: 0 is out of [1, 65536]"));
  EXPECT_THAT(ErrorOf("name: 'x' dtype: 'int8' pad_value: 300"),
              HasSubstr(".pad_value: 300 is not a int8"));
  EXPECT_THAT(ErrorOf("name: 'x' dtype: 'int16' layer_axis: true"),
              HasSubstr(".layer_axis: needs inner_shape [layers, ...]"));
  EXPECT_THAT(ErrorOf("name: 'x' dtype: 'int16' inner_shape: [3, 2] layer_axis: true"),
              HasSubstr(".inner_shape: the layer axis holds 3 layers; the model has 4"));
  EXPECT_THAT(
      ErrorOf("name: 'm' dtype: 'uint8' role: ROLE_LOSS_MASK"),
      HasSubstr(".role: a loss mask is a uint8 field of one value per token, ALIGN_LABELS"));
  EXPECT_THAT(ErrorOf("name: 'x' dtype: 'int8' stages: STAGES_LAYERS"),
              HasSubstr(".stages: STAGES_LAYERS needs layer_axis"));
}

TEST(SideFieldsTest, ASideFieldLivesBesideItsDatasetUnlessNamed) {
  const auto spec = Parse<v1::DatasetSpec>(
      "prefix: '/data/chat' side_field_prefixes { key: 'experts' "
      "value: '/elsewhere/experts' }");
  EXPECT_EQ(SideFieldPrefix(spec, "logprobs"), "/data/chat_logprobs");
  EXPECT_EQ(SideFieldPrefix(spec, "experts"), "/elsewhere/experts");
}

class SideDatasetTest : public ::testing::Test {
 protected:
  // A dataset of `dtype` whose documents hold sequences of the given token
  // counts, `per_token` values per token.
  std::shared_ptr<dataset::IndexedDataset> Write(const std::string& name, dataset::DType dtype,
                                                 const std::vector<std::vector<int>>& documents,
                                                 int per_token = 1) {
    const std::string prefix = dir_.Prefix(name);
    absl::StatusOr<dataset::IndexedDatasetWriter> writer =
        dataset::IndexedDatasetWriter::Create(prefix, dtype);
    EXPECT_TRUE(writer.ok()) << writer.status();
    for (const std::vector<int>& document : documents) {
      for (int length : document) {
        EXPECT_TRUE(writer->AddSequence(std::vector<int64_t>(length * per_token, 1)).ok());
      }
      writer->EndDocument();
    }
    EXPECT_TRUE(writer->Finish().ok());
    absl::StatusOr<dataset::IndexedDataset> opened = dataset::IndexedDataset::Open(prefix);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return std::make_shared<dataset::IndexedDataset>(*std::move(opened));
  }

  packfeed::testing::ScopedTempDir dir_;
};

TEST_F(SideDatasetTest, TheSameDocumentsWithTheirValuesPerTokenPass) {
  const auto tokens = Write("tokens", dataset::DType::kInt32, {{5, 3}, {4}});
  const SideFieldInfo experts =
      *Resolve("name: 'experts' dtype: 'int16' inner_shape: [4, 2] layer_axis: true");
  EXPECT_TRUE(
      CheckSideDataset(experts, *tokens, *Write("ok", dataset::DType::kInt16, {{5, 3}, {4}}, 8))
          .ok());
  // float16 is stored as int16 or uint16 (Megatron has no 16-bit float dtype).
  const SideFieldInfo half = *Resolve("name: 'h' dtype: 'float16'");
  EXPECT_TRUE(
      CheckSideDataset(half, *tokens, *Write("u16", dataset::DType::kUint16, {{5, 3}, {4}})).ok());
}

TEST_F(SideDatasetTest, AFileThatDoesNotMatchItsTokensIsRefusedNamingWhere) {
  const auto tokens = Write("tokens", dataset::DType::kInt32, {{5, 3}, {4}});
  const SideFieldInfo logprobs = *Resolve("name: 'logprobs' dtype: 'float32'");
  auto error_of = [&](const std::shared_ptr<dataset::IndexedDataset>& side) {
    const absl::Status status = CheckSideDataset(logprobs, *tokens, *side);
    EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
    return std::string(status.message());
  };
  EXPECT_THAT(error_of(Write("dtype", dataset::DType::kInt32, {{5, 3}, {4}})),
              HasSubstr("side field logprobs is float32 but the file holds int32"));
  EXPECT_THAT(error_of(Write("count", dataset::DType::kFloat32, {{5, 3}})),
              HasSubstr("side field logprobs holds 1 documents of 2 sequences"));
  EXPECT_THAT(error_of(Write("split", dataset::DType::kFloat32, {{5}, {3, 4}})),
              HasSubstr("side field logprobs document 1 starts at another sequence"));
  EXPECT_THAT(error_of(Write("length", dataset::DType::kFloat32, {{5, 2}, {4}})),
              HasSubstr("side field logprobs sequence 1 holds 2 values"));
}

}  // namespace
}  // namespace packfeed::server
