#include "server/pipeline/position_writers.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace packfeed::server {
namespace {

using dataset::SampleKind;

template <typename T>
void Fill(T* field, int64_t at, int64_t count, T value) {
  if (field != nullptr && count > 0) std::fill_n(field + at, count, value);
}

// Tokens [from, from + count) of `run` at position `at` of `field`.
void CopyRun(int64_t* field, int64_t at, absl::Span<const int64_t> run, int64_t from,
             int64_t count) {
  if (field != nullptr && count > 0) {
    std::memcpy(field + at, run.data() + from, static_cast<size_t>(count) * sizeof(int64_t));
  }
}

void Positions(int64_t* field, int64_t at, int64_t count, int64_t first) {
  if (field != nullptr && count > 0) std::iota(field + at, field + at + count, first);
}

// `count` pad positions at `at`: every field zero (Megatron zeroes a pad
// slot), marked in padding_mask.
void WritePads(int64_t at, int64_t count, const TokenFields& out) {
  Fill<int64_t>(out.tokens, at, count, 0);
  Fill<int64_t>(out.labels, at, count, 0);
  Fill(out.loss_mask, at, count, 0.0f);
  Fill<int64_t>(out.position_ids, at, count, 0);
  Fill<uint8_t>(out.padding_mask, at, count, 1);
}

// Positions [begin, end) of a varlen sequence (real length `real`, the run
// holding its label t[real] too) at position `at`: Megatron zeroes every
// field of a pad slot.
void WriteVarlenPositions(absl::Span<const int64_t> run, int64_t real, int64_t begin, int64_t end,
                          int64_t at, const TokenFields& out) {
  const int64_t kept = std::clamp(real, begin, end) - begin;
  CopyRun(out.tokens, at, run, begin, kept);
  CopyRun(out.labels, at, run, begin + 1, kept);
  Fill(out.loss_mask, at, kept, 1.0f);
  Positions(out.position_ids, at, kept, begin);
  Fill<uint8_t>(out.padding_mask, at, kept, 0);
  WritePads(at + kept, end - begin - kept, out);
}

// The same for SFT's b = t + pads: pad slots keep the pad id and running
// positions; a position whose label is a pad (or Megatron's ignore index)
// is not trained.
void WriteSftPositions(absl::Span<const int64_t> run, int64_t real, int64_t begin, int64_t end,
                       int64_t pad_id, int64_t at, const TokenFields& out) {
  const auto run_length = static_cast<int64_t>(run.size());
  const int64_t count = end - begin;
  const int64_t stored_tokens = std::clamp(run_length, begin, end) - begin;
  const int64_t stored_labels = std::clamp(run_length - 1, begin, end) - begin;
  CopyRun(out.tokens, at, run, begin, stored_tokens);
  Fill(out.tokens, at + stored_tokens, count - stored_tokens, pad_id);
  CopyRun(out.labels, at, run, begin + 1, stored_labels);
  Fill(out.labels, at + stored_labels, count - stored_labels, pad_id);
  if (out.loss_mask != nullptr) {
    for (int64_t k = 0; k < count; ++k) {
      const int64_t label = k < stored_labels ? run[static_cast<size_t>(begin + k + 1)] : pad_id;
      out.loss_mask[at + k] = label == pad_id || label == -100 ? 0.0f : 1.0f;
    }
  }
  Positions(out.position_ids, at, count, begin);
  const int64_t real_positions = std::clamp(real, begin, end) - begin;
  Fill<uint8_t>(out.padding_mask, at, real_positions, 0);
  Fill<uint8_t>(out.padding_mask, at + real_positions, count - real_positions, 1);
}

// Positions [begin, end) of a Megatron pretraining sample, as
// GPTDataset.__getitem__ makes them: tokens = text[:-1], labels = text[1:]
// (text padded with the pad id to seq_length + 1); the loss masked at an
// EOD input (eod_mask_loss) and a pad label; positions restarting after each
// EOD input (reset_position_ids); pad ids served as 0.
void WritePretrainingPositions(absl::Span<const int64_t> run, int64_t begin, int64_t end,
                               const dataset::SampleRules& rules, int64_t at,
                               const TokenFields& out) {
  const auto run_length = static_cast<int64_t>(run.size());
  auto text = [&](int64_t j) {
    return j < run_length ? run[static_cast<size_t>(j)] : rules.pad_id;
  };
  int64_t document_start = 0;
  if (rules.reset_position_ids) {
    for (int64_t k = begin - 1; k >= 0; --k) {
      if (text(k) == rules.eod_id) {
        document_start = k + 1;
        break;
      }
    }
  }
  for (int64_t j = begin; j < end; ++j, ++at) {
    const int64_t token = text(j);
    const int64_t label = text(j + 1);
    const bool masked = (rules.eod_mask_loss && token == rules.eod_id) || label == rules.pad_id;
    if (out.padding_mask != nullptr) out.padding_mask[at] = j >= run_length ? 1 : 0;
    if (out.tokens != nullptr) out.tokens[at] = token == rules.pad_id ? 0 : token;
    if (out.labels != nullptr) out.labels[at] = label == rules.pad_id ? 0 : label;
    if (out.loss_mask != nullptr) out.loss_mask[at] = masked ? 0.0f : 1.0f;
    if (out.position_ids != nullptr) {
      out.position_ids[at] = rules.reset_position_ids ? j - document_start : j;
    }
    if (rules.reset_position_ids && token == rules.eod_id) document_start = j + 1;
  }
}

}  // namespace

void WritePositions(absl::Span<const int64_t> run, int64_t real, int64_t begin, int64_t end,
                    const dataset::SampleRules& rules, int64_t at, const TokenFields& out) {
  switch (rules.kind) {
    case SampleKind::kPretraining: {
      // Past `real` (a hybrid-CP sub-sample padded for its CP split):
      // padding, as varlen pads are, though the run holds the next label.
      const int64_t kept = std::clamp(real, begin, end);
      WritePretrainingPositions(run, begin, kept, rules, at, out);
      WritePads(at + kept - begin, end - kept, out);
      break;
    }
    case SampleKind::kVarlen:
      WriteVarlenPositions(run, real, begin, end, at, out);
      break;
    default:
      WriteSftPositions(run, real, begin, end, rules.pad_id, at, out);
  }
}

void RestartPositions(const SampleBounds& bounds, scheduler::TokenRange range, int64_t at,
                      int64_t* position_ids) {
  if (position_ids == nullptr) return;
  auto next = std::upper_bound(bounds.begin(), bounds.end(), range.begin);
  int64_t start = *(next - 1);
  for (int64_t j = range.begin; j < range.end; ++j, ++at) {
    for (; next != bounds.end() && *next <= j; ++next) start = *next;
    position_ids[at] = j - start;
  }
}

}  // namespace packfeed::server
