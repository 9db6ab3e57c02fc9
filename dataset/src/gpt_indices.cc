#include "packfeed/dataset/gpt_indices.h"

#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "packfeed/dataset/numpy_compat.h"

namespace packfeed::dataset {
namespace {

// The final epoch is shuffled apart when fewer than this share of its
// samples are drawn, so the unused remainder does not dilute the shuffle.
constexpr double kSeparateFinalEpochThreshold = 0.80;

// _build_document_index: `epochs` copies of [first, end), shuffled as one.
void AppendShuffledEpochs(int64_t first, int64_t end, int epochs, NumpyRandomState& random,
                          std::vector<int32_t>& out) {
  const size_t start = out.size();
  for (int e = 0; e < epochs; ++e) {
    for (int64_t s = first; s < end; ++s) out.push_back(static_cast<int32_t>(s));
  }
  random.Shuffle(absl::MakeSpan(out).subspan(start));
}

// _build_shuffle_index's halves: [first, end) shuffled.
void AppendShuffledRange(int64_t first, int64_t end, NumpyRandomState& random,
                         std::vector<int64_t>& out) {
  const size_t start = out.size();
  for (int64_t s = first; s < end; ++s) out.push_back(s);
  random.Shuffle(absl::MakeSpan(out).subspan(start));
}

// helpers.cpp build_sample_idx, step for step.
std::vector<SampleStart> BuildSampleIndex(absl::Span<const int32_t> lengths,
                                          absl::Span<const int32_t> document_index,
                                          int64_t num_samples, const GptIndexOptions& options) {
  const int64_t extra = options.add_extra_token ? 1 : 0;
  std::vector<SampleStart> index;
  index.reserve(static_cast<size_t>(num_samples + 1));
  int64_t position = 0;
  int64_t offset = 0;
  index.push_back({position, offset});
  const auto last_position = static_cast<int64_t>(document_index.size()) - 1;
  while (static_cast<int64_t>(index.size()) <= num_samples) {
    int64_t remaining = options.sequence_length + extra;
    while (remaining != 0) {
      const int64_t sequence_length = lengths[static_cast<size_t>(document_index[position])];
      const int64_t left_in_sequence = sequence_length - offset;
      remaining -= left_in_sequence;
      if (remaining <= 0) {
        // The sample ends inside this sequence; with the extra token the
        // next sample starts on the last token of this one.
        offset += remaining + left_in_sequence - extra;
        remaining = 0;
      } else if (position == last_position) {
        // A partial last sample (kept only when not dropped) ends here.
        offset = sequence_length - extra;
        break;
      } else {
        ++position;
        offset = 0;
        // The walk is sequential in the document index but random in the
        // lengths: fetch a length a few sequences ahead (most of the build
        // time on 10^7 sequences is otherwise this miss).
        constexpr int64_t kAhead = 16;
        if (position + kAhead <= last_position) {
          __builtin_prefetch(&lengths[static_cast<size_t>(document_index[position + kAhead])]);
        }
      }
    }
    index.push_back({position, offset});
  }
  return index;
}

}  // namespace

absl::StatusOr<GptIndices> BuildGptIndices(absl::Span<const int32_t> sequence_lengths,
                                           int64_t first, int64_t end,
                                           std::optional<int64_t> num_samples,
                                           const GptIndexOptions& options) {
  const auto size = static_cast<int64_t>(sequence_lengths.size());
  if (options.sequence_length < 2 || options.sequence_length > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence_length ", options.sequence_length, " is not in [2, 2^31)"));
  }
  if (first < 0 || end > size || first >= end) {
    return absl::InvalidArgumentError(absl::StrCat("the split's sequences [", first, ", ", end,
                                                   ") are empty or outside the dataset's ", size));
  }
  if (num_samples.has_value() && *num_samples < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_samples ", *num_samples, " < 0"));
  }
  const int64_t extra = options.add_extra_token ? 1 : 0;
  const int64_t seq = options.sequence_length;
  GptIndices out;
  for (int64_t s = first; s < end; ++s) {
    if (sequence_lengths[static_cast<size_t>(s)] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has a negative length"));
    }
    out.tokens_per_epoch += sequence_lengths[static_cast<size_t>(s)];
  }
  const int64_t tokens = out.tokens_per_epoch;
  // With a sample count, Megatron repeats a small split for as many epochs
  // as the count needs; without one, a split shorter than a sample has none.
  if (tokens < 2 || (!num_samples.has_value() && tokens < seq + extra)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the split's sequences [", first, ", ", end, ") hold ", tokens,
                     " tokens, fewer than one sample of ", seq + extra, " needs"));
  }

  // _get_num_epochs: the fewest passes that hold num_samples samples.
  out.num_epochs = 1;
  if (num_samples.has_value()) {
    const int64_t needed = *num_samples * seq + extra;
    const int64_t epochs = (needed + tokens - 1) / tokens;
    if (epochs > INT32_MAX / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(*num_samples, " samples need ", epochs, " passes over ", tokens, " tokens"));
    }
    out.num_epochs = std::max<int>(1, static_cast<int>(epochs));
  }
  const int epochs = out.num_epochs;
  int64_t samples_before_final = 0;
  if (epochs > 1) {
    samples_before_final = ((epochs - 1) * tokens - extra) / seq;
    const int64_t from_final = *num_samples - samples_before_final;
    const int64_t per_epoch = (tokens - extra) / seq;
    out.separate_final_epoch = from_final < static_cast<int64_t>(kSeparateFinalEpochThreshold *
                                                                 static_cast<double>(per_epoch));
  }
  const int64_t documents = (end - first) * epochs;
  if (documents > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("the document index would hold ", documents, " entries (> 2^31)"));
  }

  NumpyRandomState random(options.random_seed);
  out.document_index.reserve(static_cast<size_t>(documents));
  if (out.separate_final_epoch) {
    AppendShuffledEpochs(first, end, epochs - 1, random, out.document_index);
    AppendShuffledEpochs(first, end, 1, random, out.document_index);
  } else {
    AppendShuffledEpochs(first, end, epochs, random, out.document_index);
  }

  const int64_t all_tokens = epochs * tokens - extra;
  const int64_t built =
      options.drop_last_partial
          ? all_tokens / seq
          // build_sample_idx computes this in single precision; so do we.
          : static_cast<int64_t>(std::ceil(static_cast<float>(all_tokens) /
                                           static_cast<float>(static_cast<int32_t>(seq))));
  out.sample_index = BuildSampleIndex(sequence_lengths, out.document_index, built, options);

  out.shuffle_index.reserve(static_cast<size_t>(built));
  const int64_t first_part = out.separate_final_epoch ? samples_before_final : built;
  AppendShuffledRange(0, first_part, random, out.shuffle_index);
  if (first_part < built) AppendShuffledRange(first_part, built, random, out.shuffle_index);
  return out;
}

absl::Status CheckGptIndices(const GptIndices& indices, absl::Span<const int32_t> sequence_lengths,
                             int64_t first, int64_t end, const GptIndexOptions& options) {
  const int64_t extra = options.add_extra_token ? 1 : 0;
  const auto positions = static_cast<int64_t>(indices.document_index.size());
  for (int64_t p = 0; p < positions; ++p) {
    const int32_t sequence = indices.document_index[static_cast<size_t>(p)];
    if (sequence < first || sequence >= end) {
      return absl::InvalidArgumentError(absl::StrCat("document index entry ", p, " is sequence ",
                                                     sequence, ", outside [", first, ", ", end,
                                                     ")"));
    }
  }
  SampleStart previous{0, 0};
  for (size_t j = 0; j < indices.sample_index.size(); ++j) {
    const SampleStart at = indices.sample_index[j];
    if (at.document_position < 0 || at.document_position >= positions) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample index entry ", j, " points past the document index"));
    }
    const int32_t length = sequence_lengths[static_cast<size_t>(
        indices.document_index[static_cast<size_t>(at.document_position)])];
    const bool ordered =
        at.document_position > previous.document_position ||
        (at.document_position == previous.document_position && at.offset >= previous.offset);
    if (at.offset < 0 || at.offset + (j > 0 ? extra : 0) > length || !ordered) {
      return absl::InvalidArgumentError(absl::StrCat("sample index entry ", j, " (offset ",
                                                     at.offset,
                                                     ") is out of order or outside "
                                                     "its sequence of ",
                                                     length, " tokens"));
    }
    previous = at;
  }
  const auto samples = static_cast<int64_t>(indices.sample_index.size()) - 1;
  if (samples < 0 || static_cast<int64_t>(indices.shuffle_index.size()) != samples) {
    return absl::InvalidArgumentError("the shuffle index does not hold one entry per sample");
  }
  std::vector<bool> seen(static_cast<size_t>(samples), false);
  for (int64_t value : indices.shuffle_index) {
    if (value < 0 || value >= samples || seen[static_cast<size_t>(value)]) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shuffle index is not a permutation of the ", samples, " samples"));
    }
    seen[static_cast<size_t>(value)] = true;
  }
  return absl::OkStatus();
}

std::vector<SampleRun> RunsOfSample(const GptIndices& indices,
                                    absl::Span<const int32_t> sequence_lengths,
                                    const GptIndexOptions& options, int64_t i) {
  const int64_t extra = options.add_extra_token ? 1 : 0;
  const auto j = static_cast<size_t>(indices.shuffle_index[static_cast<size_t>(i)]);
  const SampleStart begin = indices.sample_index[j];
  const SampleStart end = indices.sample_index[j + 1];
  const auto per_pass = static_cast<int64_t>(indices.document_index.size()) / indices.num_epochs;
  std::vector<SampleRun> runs;
  for (int64_t p = begin.document_position; p <= end.document_position; ++p) {
    const int64_t sequence = indices.document_index[static_cast<size_t>(p)];
    const int64_t offset = p == begin.document_position ? begin.offset : 0;
    const int64_t stop = p == end.document_position
                             ? end.offset + extra
                             : sequence_lengths[static_cast<size_t>(sequence)];
    if (stop > offset) runs.push_back({sequence, offset, stop - offset, p / per_pass});
  }
  return runs;
}

}  // namespace packfeed::dataset
