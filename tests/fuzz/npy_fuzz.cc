// libFuzzer target for Megatron's cached indices as packfeed reads them:
// any byte string must be refused by the .npy parser with a status or
// parse into an array whose every element reads inside the input; and
// indices assembled from such arrays must either fail CheckGptIndices or
// give every sample runs inside the dataset's sequences (ASan checks the
// reads). The input is cut into three .npy files at two length bytes.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "packfeed/dataset/gpt_indices.h"
#include "packfeed/dataset/npy_file.h"

namespace {

using packfeed::dataset::GptIndexOptions;
using packfeed::dataset::GptIndices;
using packfeed::dataset::NpyArray;
using packfeed::dataset::ParseNpy;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t cut1 = std::min<size_t>(data[0] * 4, bytes.size());
  const size_t cut2 = std::min<size_t>(cut1 + data[1] * 4, bytes.size());
  auto documents = ParseNpy(bytes.substr(0, cut1), "document_index.npy");
  auto samples = ParseNpy(bytes.substr(cut1, cut2 - cut1), "sample_index.npy");
  auto shuffle = ParseNpy(bytes.substr(cut2), "shuffle_index.npy");
  for (const auto* array : {&documents, &samples, &shuffle}) {
    if (!array->ok()) continue;
    int64_t sum = 0;
    for (int64_t i = 0; i < (*array)->elements(); ++i) sum += (*array)->IntAt(i);
    (void)sum;
  }
  if (!documents.ok() || !samples.ok() || !shuffle.ok() || samples->shape.size() != 2 ||
      samples->shape[1] != 2) {
    return 0;
  }
  // A dataset of 16 sequences of 1..16 tokens; the split is all of it.
  std::vector<int32_t> lengths;
  for (int32_t s = 0; s < 16; ++s) lengths.push_back(1 + s);
  GptIndices indices;
  indices.num_epochs = 1;
  for (int64_t i = 0; i < documents->elements(); ++i) {
    indices.document_index.push_back(static_cast<int32_t>(documents->IntAt(i)));
  }
  for (int64_t i = 0; i < samples->shape[0]; ++i) {
    indices.sample_index.push_back({samples->IntAt(2 * i), samples->IntAt(2 * i + 1)});
  }
  for (int64_t i = 0; i < shuffle->elements(); ++i)
    indices.shuffle_index.push_back(shuffle->IntAt(i));
  const GptIndexOptions options{.sequence_length = 4};
  if (indices.document_index.empty() || !CheckGptIndices(indices, lengths, 0, 16, options).ok()) {
    return 0;
  }
  for (int64_t i = 0; i < indices.num_samples(); ++i) {
    for (const auto& run : RunsOfSample(indices, lengths, options, i)) {
      if (run.offset < 0 || run.offset + run.length > lengths[static_cast<size_t>(run.sequence)]) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
