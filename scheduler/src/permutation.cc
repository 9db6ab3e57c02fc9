#include "packfeed/scheduler/permutation.h"

namespace packfeed::scheduler {
namespace {

// Four rounds make a Feistel network a strong pseudo-random permutation
// (Luby–Rackoff); two more cost little and mix small domains better.
constexpr int kRounds = 6;

}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Permutation::Permutation(uint64_t n, uint64_t seed) : n_(n), seed_(seed) {
  int bits = 2;  // at least one bit per half
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t Permutation::Round(uint64_t half, int round) const {
  return Mix64(seed_ ^ Mix64(half + (uint64_t(round) << 56))) & half_mask_;
}

uint64_t Permutation::operator()(uint64_t index) const {
  // The domain is at most 4n, so the walk takes fewer than 4 steps on
  // average; it ends because a permutation's cycle through `index` returns
  // to [0, n).
  uint64_t x = index;
  do {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & half_mask_;
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t next = left ^ Round(right, r);
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= n_);
  return x;
}

}  // namespace packfeed::scheduler
