#ifndef PACKFEED_SCHEDULER_PADDING_H_
#define PACKFEED_SCHEDULER_PADDING_H_

// Per-sequence padding (docs/CONTRACT.md): a sequence running with CP size c is
// padded to a multiple of 2·c (1 when c = 1), times TP when sequence
// parallelism is on, so that zigzag CP splits it evenly.

#include <cstdint>

namespace packfeed::scheduler {

// REQUIRES: cp_size >= 1, tp >= 1.
inline int64_t PaddingDivisor(int cp_size, int tp, bool sequence_parallel) {
  const int64_t cp_part = cp_size > 1 ? 2 * int64_t{cp_size} : 1;
  return cp_part * (sequence_parallel ? tp : 1);
}

// `length` rounded up to a multiple of `divisor`. REQUIRES: divisor >= 1.
inline int64_t PadTo(int64_t length, int64_t divisor) {
  return (length + divisor - 1) / divisor * divisor;
}

// A sequence's own CP size: the smallest of min_cp, 2·min_cp, … up to
// max_cp at which its padded share, padded / c, fits `cap` tokens per rank;
// 0 when none does. Static CP passes min_cp = max_cp (any size).
inline int SmallestFittingCp(int64_t length, int min_cp, int max_cp, int64_t cap, int tp,
                             bool sequence_parallel) {
  for (int c = min_cp;; c *= 2) {
    if (PadTo(length, PaddingDivisor(c, tp, sequence_parallel)) / c <= cap) return c;
    if (c >= max_cp) return 0;
  }
}

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_PADDING_H_
