#include "packfeed/server/microbatch_packer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace packfeed {

SampleShape ShapeOfSample(int64_t stored_tokens, const SampleRules& rules) {
  const int64_t length = stored_tokens + (rules.append_eod ? 1 : 0);
  // Megatron's mock rules: a varlen run may hold seq_length + 1 tokens (its
  // EOD is only a label), an sft run seq_length; a longer one keeps its first
  // seq_length − 1 tokens and ends in a forced EOD.
  const int64_t limit =
      rules.kind == SampleKind::kVarlen ? rules.seq_length + 1 : rules.seq_length;
  if (length > limit) return {rules.seq_length - 1, rules.seq_length};
  return {stored_tokens, length};
}

std::vector<int64_t> MakeTokenRun(absl::Span<const int64_t> read, const SampleShape& shape,
                                  const SampleRules& rules) {
  std::vector<int64_t> run(read.begin(), read.end());
  // One token short: an appended EOD, or the EOD forced after a truncation.
  if (static_cast<int64_t>(run.size()) < shape.run_length) run.push_back(rules.eod_id);
  return run;
}

int64_t RealLength(int64_t run_length, const SampleRules& rules) {
  return rules.kind == SampleKind::kVarlen ? run_length - 1 : run_length;
}

StageFields FieldsOfStage(int pp_rank, int pp_size) {
  return {pp_rank == 0, pp_rank == pp_size - 1};
}

namespace {

// Appends positions [begin, end) of one sequence to `out`.
void AppendPositions(const std::vector<int64_t>& run, int64_t real_length,
                     int64_t begin, int64_t end, const SampleRules& rules,
                     PackedMicrobatch& out) {
  const int64_t run_length = static_cast<int64_t>(run.size());
  for (int64_t j = begin; j < end; ++j) {
    const bool pad = j >= real_length;
    out.padding_mask.push_back(pad ? 1 : 0);
    if (rules.kind == SampleKind::kVarlen) {
      // Megatron zeroes every field of a pad slot.
      out.tokens.push_back(pad ? 0 : run[j]);
      out.labels.push_back(pad ? 0 : run[j + 1]);
      out.loss_mask.push_back(pad ? 0.0f : 1.0f);
      out.position_ids.push_back(pad ? 0 : j);
    } else {
      // b = t + pads: pad slots keep the pad id and running positions; a
      // position whose label is a pad (or Megatron's ignore index) is not
      // trained.
      const int64_t token = j < run_length ? run[j] : rules.pad_id;
      const int64_t label = j + 1 < run_length ? run[j + 1] : rules.pad_id;
      out.tokens.push_back(token);
      out.labels.push_back(label);
      out.loss_mask.push_back(label == rules.pad_id || label == -100 ? 0.0f : 1.0f);
      out.position_ids.push_back(j);
    }
  }
}

}  // namespace

absl::StatusOr<PackedMicrobatch> PackMicrobatch(
    const CpGroup& group, absl::Span<const std::vector<int64_t>* const> runs,
    int cp_rank, const SampleRules& rules) {
  const int c = group.size;
  if (cp_rank < 0 || cp_rank >= c) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp rank ", cp_rank, " outside a group of ", c));
  }
  if (runs.size() != group.sequences.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        runs.size(), " token runs for ", group.sequences.size(), " sequences"));
  }
  PackedMicrobatch out;
  out.cu_seqlens.push_back(0);
  out.cu_seqlens_padded.push_back(0);
  int64_t real_total = 0;
  int64_t padded_total = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const PlannedSequence& sequence = group.sequences[i];
    const std::vector<int64_t>& run = *runs[i];
    const int64_t padded = sequence.padded_length;
    const int64_t real = sequence.length;
    // varlen reads labels up to t[real]; sft reads within the run.
    const int64_t needed = rules.kind == SampleKind::kVarlen ? real + 1 : 0;
    if (static_cast<int64_t>(run.size()) < needed || real > padded ||
        static_cast<int64_t>(run.size()) > padded + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", sequence.sample, ": run of ", run.size(), " tokens for length ",
          real, " padded to ", padded));
    }
    if (c > 1 && padded % (2 * c) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", sequence.sample, ": padded length ", padded,
          " does not split into ", 2 * c, " chunks"));
    }
    if (c == 1) {
      AppendPositions(run, real, 0, padded, rules, out);
    } else {
      // Zigzag: chunk k then chunk 2c−1−k of 2c equal chunks.
      const int64_t chunk = padded / (2 * c);
      AppendPositions(run, real, cp_rank * chunk, (cp_rank + 1) * chunk, rules, out);
      AppendPositions(run, real, (2 * c - 1 - cp_rank) * chunk, (2 * c - cp_rank) * chunk,
                      rules, out);
    }
    real_total += real;
    padded_total += padded;
    if (padded_total > INT32_MAX) {
      return absl::InvalidArgumentError("microbatch exceeds 2^31 tokens");
    }
    out.cu_seqlens.push_back(static_cast<int32_t>(real_total));
    out.cu_seqlens_padded.push_back(static_cast<int32_t>(padded_total));
    out.max_seqlen = std::max<int32_t>(out.max_seqlen, static_cast<int32_t>(padded));
  }
  return out;
}

}  // namespace packfeed
