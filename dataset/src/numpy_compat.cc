#include "packfeed/dataset/numpy_compat.h"

#include <cfenv>
#include <cmath>

namespace packfeed::dataset {

namespace {

// numpy's pairwise_sum for float64 (numpy/core/src/umath/loops_utils.h.src).
double PairwiseSum(const double* a, size_t n) {
  constexpr size_t kBlock = 128;
  if (n < 8) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= kBlock) {
    double r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    size_t i = 8;
    for (; i + 8 <= n; i += 8) {
      for (int k = 0; k < 8; ++k) r[k] += a[i + static_cast<size_t>(k)];
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  size_t half = n / 2;
  half -= half % 8;
  return PairwiseSum(a, half) + PairwiseSum(a + half, n - half);
}

}  // namespace

double NumpySum(absl::Span<const double> values) {
  return PairwiseSum(values.data(), values.size());
}

int64_t PythonRound(double x) {
  // nearbyint rounds in the current mode; the default (and only one this
  // code runs under) is to nearest, ties to even, which is Python's rule.
  return static_cast<int64_t>(std::nearbyint(x));
}

}  // namespace packfeed::dataset
