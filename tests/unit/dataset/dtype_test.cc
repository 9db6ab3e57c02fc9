#include "packfeed/dataset/dtype.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::dataset {
namespace {

TEST(DTypeTest, CodesMatchMegatron) {
  struct Case {
    uint8_t code;
    absl::string_view name;
    size_t size;
  };
  const Case cases[] = {{1, "uint8", 1}, {2, "int8", 1},    {3, "int16", 2},   {4, "int32", 4},
                        {5, "int64", 8}, {6, "float64", 8}, {7, "float32", 4}, {8, "uint16", 2}};
  for (const Case& c : cases) {
    absl::StatusOr<DType> dtype = DTypeFromCode(c.code);
    ASSERT_TRUE(dtype.ok()) << c.code;
    EXPECT_EQ(DTypeName(*dtype), c.name);
    EXPECT_EQ(DTypeSize(*dtype), c.size);
    EXPECT_EQ(*DTypeFromName(c.name), *dtype);
  }
}

TEST(DTypeTest, UnknownCodesAndNamesAreErrors) {
  EXPECT_EQ(DTypeFromCode(0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DTypeFromCode(9).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(DTypeFromName("bfloat16").status().message(),
              ::testing::HasSubstr("unknown dtype 'bfloat16'"));
}

TEST(DTypeTest, OptimalTokenDTypeFollowsMegatron) {
  EXPECT_EQ(OptimalTokenDType(65499), DType::kUint16);
  EXPECT_EQ(OptimalTokenDType(65500), DType::kInt32);
  EXPECT_EQ(OptimalTokenDType(128256), DType::kInt32);
}

TEST(DTypeTest, RangesCoverExactIntegers) {
  EXPECT_EQ(DTypeMaxValue(DType::kUint16), 65535);
  EXPECT_EQ(DTypeMinValue(DType::kInt8), -128);
  EXPECT_EQ(DTypeMaxValue(DType::kFloat32), int64_t{1} << 24);
  EXPECT_TRUE(DTypeIsFloat(DType::kFloat64));
  EXPECT_FALSE(DTypeIsFloat(DType::kInt64));
}

}  // namespace
}  // namespace packfeed::dataset
