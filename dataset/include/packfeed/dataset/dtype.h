#ifndef PACKFEED_DATASET_DTYPE_H_
#define PACKFEED_DATASET_DTYPE_H_

// The element types of Megatron's indexed dataset, by their on-disk codes.

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packfeed::dataset {

// Values are Megatron's `DType` codes, stored in byte 17 of every .idx file.
enum class DType : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};

// Returns the dtype for an on-disk code, or DataLoss for an unknown code.
absl::StatusOr<DType> DTypeFromCode(uint8_t code);

// Parses a numpy-style name ("uint16", "int32", ...); InvalidArgument
// otherwise.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

absl::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);
bool DTypeIsFloat(DType dtype);

// The smallest and largest value an integer dtype holds (for floats, the
// range of integers they represent exactly).
int64_t DTypeMinValue(DType dtype);
int64_t DTypeMaxValue(DType dtype);

// Megatron's rule (DType.optimal_dtype): uint16 when the vocabulary has fewer
// than 65 500 entries, int32 otherwise.
DType OptimalTokenDType(int64_t vocab_size);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_DTYPE_H_
