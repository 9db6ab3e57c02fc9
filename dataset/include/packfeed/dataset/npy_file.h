#ifndef PACKFEED_DATASET_NPY_FILE_H_
#define PACKFEED_DATASET_NPY_FILE_H_

// numpy's .npy format (versions 1–3), enough for index arrays: a
// little-endian integer array in C order. Megatron caches its dataset
// indices this way, and packfeedctl writes samples this way for a
// side-by-side check.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packfeed::dataset {

struct NpyArray {
  std::string descr;           // numpy's type string: "<i4", "<i8", "<u4", "<i2", "|u1", …
  std::vector<int64_t> shape;  // () for a scalar
  std::string data;            // the elements, C order

  int64_t elements() const;
  // Element i as int64. REQUIRES: an integer descr, 0 <= i < elements().
  int64_t IntAt(int64_t i) const;
};

// Parses `bytes`, the whole of file `path`. DataLoss naming the file for a
// bad magic, a header that does not parse, Fortran order, a type other
// than a little-endian (or one-byte) integer, or a data size that does not
// match the shape.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view path);
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// Writes `array` as a version 1.0 .npy file (replacing `path`).
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

// An NpyArray of int64 values with `shape`.
NpyArray Int64Npy(std::vector<int64_t> values, std::vector<int64_t> shape);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_NPY_FILE_H_
