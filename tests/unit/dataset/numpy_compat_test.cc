#include "packfeed/dataset/numpy_compat.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace packfeed::dataset {
namespace {

// Expected values were printed by numpy 1.24 (Debian 12):
//   rs = numpy.random.RandomState(1234); x = numpy.arange(10); rs.shuffle(x)
TEST(NumpyRandomStateTest, ShuffleMatchesNumpy) {
  std::vector<int32_t> x(10);
  std::iota(x.begin(), x.end(), 0);
  NumpyRandomState random(1234);
  random.Shuffle(absl::MakeSpan(x));
  EXPECT_EQ(x, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
}

// rs = RandomState(0); x = arange(1000); rs.shuffle(x): x[:8] and Σ i·x[i].
TEST(NumpyRandomStateTest, LongShuffleMatchesNumpy) {
  std::vector<int64_t> x(1000);
  std::iota(x.begin(), x.end(), 0);
  NumpyRandomState random(0);
  random.Shuffle(absl::MakeSpan(x));
  EXPECT_EQ(std::vector<int64_t>(x.begin(), x.begin() + 8),
            (std::vector<int64_t>{993, 859, 298, 553, 672, 971, 27, 231}));
  int64_t weighted = 0;
  for (int64_t i = 0; i < 1000; ++i) weighted += i * x[static_cast<size_t>(i)];
  EXPECT_EQ(weighted, 247872640);
}

// RandomState(7).randint(0, max + 1) draws by the same masked rejection.
TEST(NumpyRandomStateTest, IntervalMatchesNumpyOn32And64BitRanges) {
  NumpyRandomState small(7);
  EXPECT_EQ(small.Interval(1000), 175u);
  EXPECT_EQ(small.Interval(1000), 196u);
  EXPECT_EQ(small.Interval(1000), 537u);
  NumpyRandomState large(7);
  const uint64_t max = uint64_t{1} << 40;
  EXPECT_EQ(large.Interval(max), 752595690692u);
  EXPECT_EQ(large.Interval(max), 108744157686u);
  EXPECT_EQ(large.Interval(max), 291964244179u);
  EXPECT_EQ(large.Interval(0), 0u);
}

// numpy.sum(numpy.array([0.1] * 7 + [0.3] * 200)) = 60.699999999999974,
// where a left-to-right sum differs in the last bits.
TEST(NumpySumTest, PairwiseLikeNumpy) {
  std::vector<double> values(7, 0.1);
  values.insert(values.end(), 200, 0.3);
  EXPECT_EQ(NumpySum(values), 60.699999999999974);
  double sequential = 0;
  for (double v : values) sequential += v;
  EXPECT_NE(sequential, NumpySum(values));
  EXPECT_EQ(NumpySum({}), 0.0);
  EXPECT_EQ(NumpySum({2.5}), 2.5);
}

TEST(PythonRoundTest, HalfToEven) {
  EXPECT_EQ(PythonRound(0.5), 0);
  EXPECT_EQ(PythonRound(1.5), 2);
  EXPECT_EQ(PythonRound(2.5), 2);
  EXPECT_EQ(PythonRound(2.5000001), 3);
  EXPECT_EQ(PythonRound(969.49), 969);
}

}  // namespace
}  // namespace packfeed::dataset
