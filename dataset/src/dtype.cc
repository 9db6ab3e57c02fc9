#include "packfeed/dataset/dtype.h"

#include <array>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packfeed::dataset {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
  int64_t min;
  int64_t max;
};

// Floats hold every integer up to 2^mantissa exactly; beyond that token ids
// would silently change, so the writer refuses them.
constexpr int64_t kFloat32Exact = int64_t{1} << 24;
constexpr int64_t kFloat64Exact = int64_t{1} << 53;

constexpr std::array<DTypeInfo, 8> kDTypes = {{
    {DType::kUint8, "uint8", 1, 0, 255},
    {DType::kInt8, "int8", 1, -128, 127},
    {DType::kInt16, "int16", 2, -32768, 32767},
    {DType::kInt32, "int32", 4, std::numeric_limits<int32_t>::min(),
     std::numeric_limits<int32_t>::max()},
    {DType::kInt64, "int64", 8, std::numeric_limits<int64_t>::min(),
     std::numeric_limits<int64_t>::max()},
    {DType::kFloat64, "float64", 8, -kFloat64Exact, kFloat64Exact},
    {DType::kFloat32, "float32", 4, -kFloat32Exact, kFloat32Exact},
    {DType::kUint16, "uint16", 2, 0, 65535},
}};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype) - 1]; }

}  // namespace

absl::StatusOr<DType> DTypeFromCode(uint8_t code) {
  if (code < 1 || code > kDTypes.size()) {
    return absl::DataLossError(
        absl::StrCat("unknown dtype code ", code, " (valid codes are 1..8)"));
  }
  return kDTypes[code - 1].dtype;
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "' (expected uint8, int8, int16, int32, int64, float64, float32, "
                   "uint16)"));
}

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }
size_t DTypeSize(DType dtype) { return Info(dtype).size; }
bool DTypeIsFloat(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kFloat64; }
int64_t DTypeMinValue(DType dtype) { return Info(dtype).min; }
int64_t DTypeMaxValue(DType dtype) { return Info(dtype).max; }

DType OptimalTokenDType(int64_t vocab_size) {
  return vocab_size < 65500 ? DType::kUint16 : DType::kInt32;
}

}  // namespace packfeed::dataset
