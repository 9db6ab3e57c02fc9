#ifndef PACKFEED_SCHEDULER_PERMUTATION_H_
#define PACKFEED_SCHEDULER_PERMUTATION_H_

// A seeded pseudo-random permutation of [0, n) evaluated one index at a time
// in O(1): a balanced Feistel network over the smallest even-bit power of
// two >= n, with cycle walking back into range. No table, so shuffling a
// billion-sample dataset costs nothing up front, and step s of epoch e is as
// cheap to compute as step 0 — resuming anywhere is free. Fully specified
// arithmetic (SplitMix64 rounds), so every node and every build agrees.

#include <cstdint>

namespace packfeed::scheduler {

class Permutation {
 public:
  // REQUIRES: n >= 1.
  Permutation(uint64_t n, uint64_t seed);

  uint64_t size() const { return n_; }
  // The image of `index`. REQUIRES: index < size().
  uint64_t operator()(uint64_t index) const;

 private:
  uint64_t Round(uint64_t half, int round) const;

  uint64_t n_;
  uint64_t seed_;
  int half_bits_;
  uint64_t half_mask_;
};

// SplitMix64's finaliser: a fixed, well-mixed 64-bit function.
uint64_t Mix64(uint64_t x);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_PERMUTATION_H_
