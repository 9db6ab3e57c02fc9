#ifndef PACKFEED_TESTS_UNIT_SERVER_INDEX_TEST_UTIL_H_
#define PACKFEED_TESTS_UNIT_SERVER_INDEX_TEST_UTIL_H_

// An .idx encoder for tests, written apart from the product's writer so that
// tests can build files the writer never would (corrupt ones).

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "packfeed/dataset/dtype.h"

namespace packfeed::dataset {

struct RawIndex {
  std::string magic = std::string("MMIDIDX\0\0", 9);
  uint64_t version = 1;
  uint8_t dtype_code = 8;
  uint64_t sequence_count = 0;  // Written as is: may disagree with arrays.
  uint64_t document_entries = 0;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  std::vector<int64_t> documents;
  std::vector<int8_t> modes;

  // A consistent index: pointers follow lengths in units of `dtype`.
  static RawIndex Contiguous(DType dtype, std::vector<int32_t> lengths,
                             std::vector<int64_t> documents) {
    RawIndex raw;
    raw.dtype_code = static_cast<uint8_t>(dtype);
    int64_t offset = 0;
    for (int32_t length : lengths) {
      raw.pointers.push_back(offset);
      offset += int64_t{length} * static_cast<int64_t>(DTypeSize(dtype));
    }
    raw.sequence_count = lengths.size();
    raw.document_entries = documents.size();
    raw.lengths = std::move(lengths);
    raw.documents = std::move(documents);
    return raw;
  }

  std::string Serialize() const {
    std::string out = magic;
    Append(out, version);
    Append(out, dtype_code);
    Append(out, sequence_count);
    Append(out, document_entries);
    for (int32_t v : lengths) Append(out, v);
    for (int64_t v : pointers) Append(out, v);
    for (int64_t v : documents) Append(out, v);
    for (int8_t v : modes) Append(out, v);
    return out;
  }

 private:
  template <typename T>
  static void Append(std::string& out, T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out.append(bytes, sizeof(T));
  }
};

}  // namespace packfeed::dataset

#endif  // PACKFEED_TESTS_UNIT_SERVER_INDEX_TEST_UTIL_H_
