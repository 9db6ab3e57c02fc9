#include "packfeed/dataset/megatron_cache.h"

#include <dirent.h>

#include <charconv>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/dataset/npy_file.h"

namespace packfeed::dataset {
namespace {

// json.dumps of a string (ensure_ascii: non-ASCII bytes cannot match a
// path Megatron escaped, so they are written as they are and simply find
// nothing).
std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(c));
      out += buffer;
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

// Python's repr of a float: the shortest text that reads back the same,
// with ".0" on an integral value.
std::string PythonFloat(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string out(buffer, result.ptr);
  if (out.find_first_of(".en") == std::string::npos) out += ".0";
  return out;
}

// The list of files in `dir` (empty when it does not exist).
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir.c_str()), &::closedir);
  if (handle == nullptr) return names;
  while (const dirent* entry = ::readdir(handle.get())) names.emplace_back(entry->d_name);
  return names;
}

absl::Status Inconsistent(const std::string& file, absl::string_view why) {
  return absl::DataLossError(
      absl::StrCat(file, ": Megatron's cached index does not fit this dataset: ", why));
}

}  // namespace

std::string GptDescriptionPrefix(const GptCacheKey& key) {
  std::string out = "{\n    \"class\": \"GPTDataset\",\n";
  absl::StrAppend(&out, "    \"dataset_path\": ", JsonString(key.dataset_path), ",\n");
  absl::StrAppend(&out, "    \"num_samples\": ",
                  key.num_samples ? absl::StrCat(*key.num_samples) : "null", ",\n");
  absl::StrAppend(&out, "    \"index_split\": \"", MegatronSplitName(key.split), "\",\n");
  absl::StrAppend(&out, "    \"random_seed\": ", key.random_seed, ",\n");
  absl::StrAppend(&out, "    \"sequence_length\": ", key.sequence_length, ",\n");
  absl::StrAppend(&out, "    \"split\": ", JsonString(key.split_string), ",\n");
  out += "    \"split_matrix\": [\n";
  const absl::StatusOr<SplitMatrix> matrix = ParseMegatronSplit(key.split_string);
  for (int s = 0; s < kNumMegatronSplits; ++s) {
    const auto& share = matrix.ok() ? (*matrix)[static_cast<size_t>(s)] : std::nullopt;
    if (!share.has_value()) {
      out += "        null";
    } else {
      // Megatron's bookends start from the integer 0.
      const std::string begin = s == 0 ? "0" : PythonFloat(share->first);
      absl::StrAppend(&out, "        [\n            ", begin, ",\n            ",
                      PythonFloat(share->second), "\n        ]");
    }
    out += s + 1 < kNumMegatronSplits ? ",\n" : "\n";
  }
  out += "    ],\n    \"tokenizer\": ";
  return out;
}

MegatronCacheDescriptions MegatronCacheDescriptions::Read(const std::string& dir) {
  MegatronCacheDescriptions out;
  for (const std::string& name : FilesIn(dir)) {
    for (int s = 0; s < kNumMegatronSplits; ++s) {
      const auto split = static_cast<MegatronSplit>(s);
      const std::string suffix =
          absl::StrCat("-GPTDataset-", MegatronSplitName(split), "-description.txt");
      if (!absl::EndsWith(name, suffix)) continue;
      absl::StatusOr<std::string> text = ReadWholeFile(dir + "/" + name);
      if (!text.ok()) continue;
      out.entries_.push_back({split, *std::move(text),
                              dir + "/" + name.substr(0, name.size() - 15)});  // "description.txt"
    }
  }
  return out;
}

std::optional<std::string> MegatronCacheDescriptions::Find(MegatronSplit split,
                                                           absl::string_view prefix) const {
  for (const Entry& entry : entries_) {
    if (entry.split == split && absl::StartsWith(entry.text, prefix)) return entry.base;
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<GptIndices>> ReadMegatronGptCache(
    const MegatronCacheDescriptions& cache, const GptCacheKey& key,
    absl::Span<const int32_t> sequence_lengths, int64_t first, int64_t end,
    const GptIndexOptions& options) {
  const std::optional<std::string> found = cache.Find(key.split, GptDescriptionPrefix(key));
  if (!found.has_value()) return std::optional<GptIndices>();
  const std::string& base = *found;
  // (A check below names the array; the files share `base`.)
  PF_ASSIGN_OR_RETURN(const NpyArray documents, ReadNpy(base + "document_index.npy"));
  PF_ASSIGN_OR_RETURN(const NpyArray samples, ReadNpy(base + "sample_index.npy"));
  PF_ASSIGN_OR_RETURN(const NpyArray shuffle, ReadNpy(base + "shuffle_index.npy"));
  const int64_t per_epoch = end - first;
  if (documents.shape.size() != 1 || documents.elements() == 0 ||
      documents.elements() % per_epoch != 0) {
    return Inconsistent(base + "document_index.npy",
                        absl::StrCat("not a multiple of the split's ", per_epoch, " sequences"));
  }
  if (samples.shape.size() != 2 || samples.shape[1] != 2 || samples.shape[0] < 1) {
    return Inconsistent(base + "sample_index.npy", "not of shape (samples + 1, 2)");
  }
  if (shuffle.shape.size() != 1 || shuffle.shape[0] != samples.shape[0] - 1) {
    return Inconsistent(base + "shuffle_index.npy", "not one entry per sample");
  }
  GptIndices out;
  out.num_epochs = static_cast<int>(documents.elements() / per_epoch);
  for (int64_t s = first; s < end; ++s) out.tokens_per_epoch += sequence_lengths[s];
  out.document_index.reserve(static_cast<size_t>(documents.elements()));
  for (int64_t i = 0; i < documents.elements(); ++i) {
    out.document_index.push_back(static_cast<int32_t>(documents.IntAt(i)));
  }
  for (int64_t i = 0; i < samples.shape[0]; ++i) {
    out.sample_index.push_back({samples.IntAt(2 * i), samples.IntAt(2 * i + 1)});
  }
  for (int64_t i = 0; i < shuffle.elements(); ++i) out.shuffle_index.push_back(shuffle.IntAt(i));
  const absl::Status fits = CheckGptIndices(out, sequence_lengths, first, end, options);
  if (!fits.ok()) return Inconsistent(base + "*.npy", fits.message());
  return std::optional<GptIndices>(std::move(out));
}

}  // namespace packfeed::dataset
