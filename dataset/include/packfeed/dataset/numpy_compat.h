#ifndef PACKFEED_DATASET_NUMPY_COMPAT_H_
#define PACKFEED_DATASET_NUMPY_COMPAT_H_

// The few numerical routines whose exact bits decide which tokens Megatron's
// GPTDataset and BlendedDataset serve, reproduced from numpy and Python so a
// packfeed index equals Megatron's element for element:
//   * numpy's legacy `RandomState(seed)` stream (MT19937 seeded by
//     init_genrand) and its in-place `shuffle` of a 1-D array;
//   * numpy's float64 `sum` (pairwise summation), which `normalize` uses;
//   * Python's `round` to an integer (half to even).
// Pure functions; NumpyRandomState is not thread-safe (one per shuffle).

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>

#include "absl/types/span.h"

namespace packfeed::dataset {

class NumpyRandomState {
 public:
  // numpy.random.RandomState(seed) for an integer seed in [0, 2^32).
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  // numpy's random_interval: uniform in [0, max] by masked rejection, from
  // 32-bit draws when max < 2^32 and 64-bit draws (two 32-bit ones, high
  // word first) above.
  // Inline, with the engine's draws: the shuffles of a corpus-scale start-up
  // make 10^8 of them (a quarter less time than a call each).
  uint64_t Interval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
    uint64_t value = 0;
    if (max <= 0xffffffffULL) {
      do {
        value = mt_() & mask;
      } while (value > max);
    } else {
      do {
        const uint64_t high = mt_();
        value = ((high << 32) | mt_()) & mask;
      } while (value > max);
    }
    return value;
  }

  // RandomState.shuffle of a 1-D array: Fisher-Yates from the end, element
  // i swapped with Interval(i).
  template <typename T>
  void Shuffle(absl::Span<T> values) {
    // The partners j depend only on i and the stream, not on the values, so
    // a block of them is drawn first and their cache lines fetched while
    // the swaps run: on arrays larger than the cache each swap would
    // otherwise wait for one miss (half the time of a 10^7-entry shuffle).
    constexpr size_t kBlock = 64;
    uint64_t partner[kBlock];
    for (size_t top = values.size(); top > 1;) {
      const size_t count = std::min(kBlock, top - 1);
      for (size_t k = 0; k < count; ++k) {
        partner[k] = Interval(top - 1 - k);
        __builtin_prefetch(&values[partner[k]], 1);
      }
      for (size_t k = 0; k < count; ++k) std::swap(values[top - 1 - k], values[partner[k]]);
      top -= count;
    }
  }

 private:
  // std::mt19937 seeded with one integer is MT19937's init_genrand, the same
  // state numpy's legacy seeding builds; its output is the same 32-bit stream.
  // It is std::mt19937's engine with 32-bit words: std::mt19937 keeps its
  // state in uint_fast32_t, 64 bits on x86-64 Linux, twice the memory for
  // the same values.
  std::mersenne_twister_engine<uint32_t, 32, 624, 397, 31, 0x9908b0df, 11, 0xffffffff, 7,
                               0x9d2c5680, 15, 0xefc60000, 18, 1812433253>
      mt_;
};

// numpy.sum of a float64 array, bit for bit (pairwise: 8 accumulators over
// blocks of at most 128, halves above).
double NumpySum(absl::Span<const double> values);

// Python's int(round(x)) for a finite x: nearest integer, ties to even.
int64_t PythonRound(double x);

}  // namespace packfeed::dataset

#endif  // PACKFEED_DATASET_NUMPY_COMPAT_H_
