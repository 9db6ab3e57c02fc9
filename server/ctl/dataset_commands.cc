#include "server/ctl/dataset_commands.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "packfeed/common/status_macros.h"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "server/ctl/exit_code.h"

namespace packfeed::server::ctl {
namespace {

struct MakeDatasetArgs {
  std::string out;
  uint64_t count = 1000;
  std::string dist = "lognormal";
  dataset::LengthDistribution lengths;
  std::string lengths_file;
  int64_t vocab = 32000;
  std::string dtype;  // Empty: Megatron's choice for the vocabulary.
  uint64_t seed = 0;
  std::vector<std::string> side_fields;  // ParseGeneratedSideField specs
};

struct DatasetInfoArgs {
  std::string prefix;
  bool json = false;
};

absl::Status MakeDataset(const MakeDatasetArgs& args) {
  std::vector<dataset::GeneratedSideField> side_fields;
  for (const std::string& spec : args.side_fields) {
    PF_ASSIGN_OR_RETURN(dataset::GeneratedSideField field, dataset::ParseGeneratedSideField(spec));
    side_fields.push_back(std::move(field));
  }
  std::vector<int64_t> lengths;
  if (!args.lengths_file.empty()) {
    PF_ASSIGN_OR_RETURN(lengths, dataset::ReadLengthsFile(args.lengths_file));
  } else {
    PF_ASSIGN_OR_RETURN(lengths, dataset::GenerateLengths(args.lengths, args.count, args.seed));
  }
  dataset::GeneratedDatasetOptions options;
  options.vocab_size = args.vocab;
  options.seed = args.seed;
  options.dtype = dataset::OptimalTokenDType(args.vocab);
  if (!args.dtype.empty()) {
    PF_ASSIGN_OR_RETURN(options.dtype, dataset::DTypeFromName(args.dtype));
  }
  PF_RETURN_IF_ERROR(dataset::WriteGeneratedDataset(args.out, lengths, options));
  uint64_t tokens = 0;
  for (int64_t length : lengths) tokens += static_cast<uint64_t>(length);
  std::printf("wrote %s.idx/.bin: %zu sequences, %llu tokens, dtype %s\n", args.out.c_str(),
              lengths.size(), static_cast<unsigned long long>(tokens),
              std::string(dataset::DTypeName(options.dtype)).c_str());
  for (const dataset::GeneratedSideField& field : side_fields) {
    const std::string prefix = absl::StrCat(args.out, "_", field.name);
    PF_RETURN_IF_ERROR(dataset::WriteGeneratedSideField(prefix, lengths, field, args.seed));
    std::printf("wrote %s.idx/.bin: side field %s\n", prefix.c_str(), field.name.c_str());
  }
  return absl::OkStatus();
}

struct Summary {
  absl::int128 token_sum = 0;
  double value_sum = 0;  // Float dtypes only.
  int64_t min_length = 0;
  int64_t max_length = 0;
};

// Reads every token once, in batches of whole sequences of about 4 Mi
// tokens, so memory stays bounded on any dataset size.
absl::StatusOr<Summary> Summarize(const dataset::IndexedDataset& dataset) {
  constexpr uint64_t kBatchTokens = uint64_t{1} << 22;
  Summary summary;
  const uint64_t n = dataset.num_sequences();
  if (n > 0) {
    summary.min_length = summary.max_length = dataset.sequence_length(0);
  }
  for (uint64_t i = 0; i < n; ++i) {
    summary.min_length = std::min<int64_t>(summary.min_length, dataset.sequence_length(i));
    summary.max_length = std::max<int64_t>(summary.max_length, dataset.sequence_length(i));
  }
  if (dataset::DTypeIsFloat(dataset.dtype())) {
    std::vector<char> raw;
    for (uint64_t i = 0; i < n; ++i) {
      raw.resize(static_cast<size_t>(dataset.sequence_length(i)) *
                 dataset::DTypeSize(dataset.dtype()));
      PF_RETURN_IF_ERROR(dataset.ReadRaw(i, absl::MakeSpan(raw)));
      for (size_t j = 0; j < raw.size(); j += dataset::DTypeSize(dataset.dtype())) {
        if (dataset.dtype() == dataset::DType::kFloat32) {
          float v;
          std::memcpy(&v, raw.data() + j, sizeof(v));
          summary.value_sum += v;
        } else {
          double v;
          std::memcpy(&v, raw.data() + j, sizeof(v));
          summary.value_sum += v;
        }
      }
    }
    return summary;
  }
  std::vector<int64_t> tokens;
  for (uint64_t first = 0; first < n;) {
    uint64_t count = 0;
    uint64_t batch_tokens = 0;
    while (first + count < n && (count == 0 || batch_tokens < kBatchTokens)) {
      batch_tokens += static_cast<uint64_t>(dataset.sequence_length(first + count));
      ++count;
    }
    tokens.resize(batch_tokens);
    PF_RETURN_IF_ERROR(dataset.ReadSequences(first, count, absl::MakeSpan(tokens)));
    for (int64_t token : tokens) summary.token_sum += token;
    first += count;
  }
  return summary;
}

absl::Status DatasetInfo(const DatasetInfoArgs& args) {
  PF_ASSIGN_OR_RETURN(dataset::IndexedDataset dataset, dataset::IndexedDataset::Open(args.prefix));
  PF_ASSIGN_OR_RETURN(Summary summary, Summarize(dataset));
  const bool is_float = dataset::DTypeIsFloat(dataset.dtype());
  const double mean_length = dataset.num_sequences() == 0
                                 ? 0.0
                                 : static_cast<double>(dataset.total_tokens()) /
                                       static_cast<double>(dataset.num_sequences());
  if (!args.json) {
    std::printf("dataset       %s\n", args.prefix.c_str());
    std::printf(
        "dtype         %s (code %d)%s\n", std::string(dataset::DTypeName(dataset.dtype())).c_str(),
        static_cast<int>(dataset.dtype()), dataset.index().multimodal() ? ", multimodal" : "");
    std::printf("sequences     %llu in %llu documents\n",
                static_cast<unsigned long long>(dataset.num_sequences()),
                static_cast<unsigned long long>(dataset.num_documents()));
    std::printf("tokens        %llu (length min %lld, mean %.1f, max %lld)\n",
                static_cast<unsigned long long>(dataset.total_tokens()),
                static_cast<long long>(summary.min_length), mean_length,
                static_cast<long long>(summary.max_length));
    if (is_float) {
      std::printf("value sum     %.17g\n", summary.value_sum);
    } else {
      std::cout << "token sum     " << summary.token_sum << "\n";
    }
    std::printf("files         .idx %llu bytes, .bin %llu bytes\n",
                static_cast<unsigned long long>(dataset.idx_bytes()),
                static_cast<unsigned long long>(dataset.bin_bytes()));
    return absl::OkStatus();
  }
  nlohmann::ordered_json out;
  out["prefix"] = args.prefix;
  out["sequences"] = dataset.num_sequences();
  out["documents"] = dataset.num_documents();
  out["dtype_code"] = static_cast<int>(dataset.dtype());
  out["dtype"] = std::string(dataset::DTypeName(dataset.dtype()));
  out["multimodal"] = dataset.index().multimodal();
  out["total_tokens"] = dataset.total_tokens();
  out["min_length"] = summary.min_length;
  out["max_length"] = summary.max_length;
  out["mean_length"] = mean_length;
  // A token sum of int64 data can exceed 64 bits; JSON integers have no
  // bound, so it is spliced in as digits rather than lose precision.
  std::ostringstream token_sum;
  token_sum << summary.token_sum;
  out["token_sum"] =
      is_float ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json("@TOKEN_SUM@");
  if (is_float) out["value_sum"] = summary.value_sum;
  out["idx_bytes"] = dataset.idx_bytes();
  out["bin_bytes"] = dataset.bin_bytes();
  std::string text = out.dump();
  const std::string marker = "\"@TOKEN_SUM@\"";
  if (size_t at = text.find(marker); at != std::string::npos) {
    text.replace(at, marker.size(), token_sum.str());
  }
  std::printf("%s\n", text.c_str());
  return absl::OkStatus();
}

}  // namespace

void AddDatasetCommands(CLI::App& app, int* exit_code) {
  auto make_args = std::make_shared<MakeDatasetArgs>();
  CLI::App* make = app.add_subcommand("make-dataset", "Write a synthetic Megatron indexed dataset");
  make->add_option("--out", make_args->out, "Output prefix (PREFIX.idx/.bin)")->required();
  make->add_option("--count", make_args->count, "Number of sequences")->capture_default_str();
  make->add_option("--dist", make_args->dist, "Length distribution")
      ->check(CLI::IsMember({"lognormal"}))
      ->capture_default_str();
  make->add_option("--min", make_args->lengths.min, "Shortest length")->capture_default_str();
  make->add_option("--max", make_args->lengths.max, "Longest length")->capture_default_str();
  make->add_option("--mean", make_args->lengths.mean, "Mean of the unclipped lognormal")
      ->capture_default_str();
  make->add_option("--sigma", make_args->lengths.sigma, "Lognormal sigma")->capture_default_str();
  make->add_option("--lengths", make_args->lengths_file,
                   "File of lengths, one per line (overrides --count/--dist)");
  make->add_option("--vocab", make_args->vocab, "Vocabulary size; tokens are uniform in [0, vocab)")
      ->capture_default_str();
  make->add_option("--dtype", make_args->dtype,
                   "Token dtype (default: uint16 below 65500 tokens, else "
                   "int32)");
  make->add_option("--seed", make_args->seed, "Random seed")->capture_default_str();
  make->add_option("--side-field", make_args->side_fields,
                   "Also write a side field as OUT_NAME.idx/.bin (repeatable): "
                   "NAME:experts:LAYERSxTOP_K:EXPERTS (int16 router-replay indices), "
                   "NAME:logprobs (float32) or NAME:prompt_mask (uint8, 0 over each "
                   "document's first 30 %)");
  make->callback([make_args, exit_code] { *exit_code = ExitCode(MakeDataset(*make_args)); });

  auto info_args = std::make_shared<DatasetInfoArgs>();
  CLI::App* info =
      app.add_subcommand("dataset-info", "Validate a dataset and summarise it (reads every token)");
  info->add_option("prefix", info_args->prefix, "Dataset prefix")->required();
  info->add_flag("--json", info_args->json, "Print one JSON object");
  info->callback([info_args, exit_code] { *exit_code = ExitCode(DatasetInfo(*info_args)); });
}

}  // namespace packfeed::server::ctl
