#include "packfeed/dataset/dataset_generator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/numeric/int128.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/dataset/indexed_dataset_writer.h"

namespace packfeed::dataset {
namespace {

// Uniform in (0, 1): 53 random bits, offset by half a step so log() never
// sees 0.
double UniformOpen(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal by Box–Muller (one of the pair; simplicity over speed).
double StandardNormal(std::mt19937_64& rng) {
  const double u1 = UniformOpen(rng);
  const double u2 = UniformOpen(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Uniform in [0, n) by Lemire's multiply-shift (bias below 2^-40 for the
// vocabularies used here, and identical on every machine).
int64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  return static_cast<int64_t>(absl::Uint128High64(absl::uint128(rng()) * absl::uint128(n)));
}

// FNV-1a of a side field's name: each field of one dataset draws apart, and
// the same on every machine (std::hash is not).
uint64_t StableSeed(absl::string_view name) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (char c : name) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  return hash;
}

}  // namespace

absl::Status ValidateLengthDistribution(const LengthDistribution& dist) {
  if (dist.min < 1 || dist.max < dist.min) {
    return absl::InvalidArgumentError(
        absl::StrCat("length range [", dist.min, ", ", dist.max, "] must satisfy 1 <= min <= max"));
  }
  if (!(dist.mean > 0) || !(dist.sigma >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lognormal mean ", dist.mean, " must be > 0 and sigma ", dist.sigma, " >= 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> GenerateLengths(const LengthDistribution& dist, uint64_t count,
                                                     uint64_t seed) {
  PF_RETURN_IF_ERROR(ValidateLengthDistribution(dist));
  std::mt19937_64 rng(seed);
  const double mu = std::log(dist.mean) - dist.sigma * dist.sigma / 2;
  std::vector<int64_t> lengths;
  lengths.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const double x = std::exp(mu + dist.sigma * StandardNormal(rng));
    // Clip in floating point first: exp() may exceed the int64 range.
    const double clipped = std::clamp(std::floor(x), double(dist.min), double(dist.max));
    lengths.push_back(static_cast<int64_t>(clipped));
  }
  return lengths;
}

absl::StatusOr<std::vector<int64_t>> ParseLengths(absl::string_view text,
                                                  absl::string_view source) {
  std::vector<int64_t> lengths;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    int64_t length;
    if (!absl::SimpleAtoi(line, &length) || length < 1 ||
        length > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": '", line,
                       "' is not a sequence length (an integer in [1, 2147483647])"));
    }
    lengths.push_back(length);
  }
  return lengths;
}

absl::StatusOr<std::vector<int64_t>> ReadLengthsFile(const std::string& path) {
  PF_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  return ParseLengths(text, path);
}

absl::Status WriteGeneratedDataset(absl::string_view prefix, const std::vector<int64_t>& lengths,
                                   const GeneratedDatasetOptions& options) {
  if (options.vocab_size < 1 || options.vocab_size - 1 > DTypeMaxValue(options.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary of ", options.vocab_size,
                                                   " tokens does not fit dtype ",
                                                   DTypeName(options.dtype)));
  }
  PF_ASSIGN_OR_RETURN(IndexedDatasetWriter writer,
                      IndexedDatasetWriter::Create(prefix, options.dtype));
  // Token stream seeded apart from the lengths so that replaying a length
  // file and generating lengths give independent tokens.
  std::mt19937_64 rng(options.seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<int64_t> tokens;
  for (int64_t length : lengths) {
    tokens.resize(static_cast<size_t>(length));
    for (int64_t& token : tokens) {
      token = UniformBelow(rng, static_cast<uint64_t>(options.vocab_size));
    }
    PF_RETURN_IF_ERROR(writer.AddSequence(tokens));
    writer.EndDocument();
  }
  return writer.Finish();
}

absl::StatusOr<GeneratedSideField> ParseGeneratedSideField(absl::string_view spec) {
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("side field '", spec, "': ", why,
                     " (NAME:experts:LAYERSxTOP_K:EXPERTS, NAME:logprobs or NAME:prompt_mask)"));
  };
  if (parts.size() < 2 || parts[0].empty()) return error("no name or kind");
  GeneratedSideField field;
  field.name = parts[0];
  if (parts[1] == "logprobs" && parts.size() == 2) {
    field.kind = GeneratedSideField::Kind::kLogProbs;
  } else if (parts[1] == "prompt_mask" && parts.size() == 2) {
    field.kind = GeneratedSideField::Kind::kPromptMask;
  } else if (parts[1] == "experts" && parts.size() == 4) {
    field.kind = GeneratedSideField::Kind::kExperts;
    const std::vector<std::string> shape = absl::StrSplit(parts[2], 'x');
    if (shape.size() != 2 || !absl::SimpleAtoi(shape[0], &field.layers) ||
        !absl::SimpleAtoi(shape[1], &field.top_k) || !absl::SimpleAtoi(parts[3], &field.experts) ||
        field.layers < 1 || field.top_k < 1 || field.experts < field.top_k ||
        field.experts > INT16_MAX) {
      return error("needs LAYERSxTOP_K >= 1 and TOP_K <= EXPERTS <= 32767");
    }
  } else {
    return error("unknown kind or wrong number of parts");
  }
  return field;
}

absl::Status WriteGeneratedSideField(absl::string_view prefix, const std::vector<int64_t>& lengths,
                                     const GeneratedSideField& field, uint64_t seed) {
  using Kind = GeneratedSideField::Kind;
  const DType dtype = field.kind == Kind::kExperts    ? DType::kInt16
                      : field.kind == Kind::kLogProbs ? DType::kFloat32
                                                      : DType::kUint8;
  PF_ASSIGN_OR_RETURN(IndexedDatasetWriter writer, IndexedDatasetWriter::Create(prefix, dtype));
  std::mt19937_64 rng(seed ^ StableSeed(field.name));
  std::string values;
  std::vector<int16_t> picked;
  for (int64_t length : lengths) {
    values.clear();
    for (int64_t t = 0; t < length; ++t) {
      if (field.kind == Kind::kPromptMask) {
        values.push_back(t < std::max<int64_t>(1, length * 3 / 10) ? 0 : 1);
      } else if (field.kind == Kind::kLogProbs) {
        const float logprob = -8.0f * static_cast<float>(UniformBelow(rng, 1 << 24)) / (1 << 24);
        values.append(reinterpret_cast<const char*>(&logprob), sizeof(logprob));
      } else {
        for (int64_t l = 0; l < field.layers; ++l) {
          picked.clear();
          while (static_cast<int64_t>(picked.size()) < field.top_k) {
            const auto expert =
                static_cast<int16_t>(UniformBelow(rng, static_cast<uint64_t>(field.experts)));
            if (std::find(picked.begin(), picked.end(), expert) == picked.end())
              picked.push_back(expert);
          }
          values.append(reinterpret_cast<const char*>(picked.data()),
                        picked.size() * sizeof(int16_t));
        }
      }
    }
    PF_RETURN_IF_ERROR(writer.AddEncodedSequence(values));
    writer.EndDocument();
  }
  return writer.Finish();
}

}  // namespace packfeed::dataset
