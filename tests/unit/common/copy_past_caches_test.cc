#include "packfeed/common/copy_past_caches.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace packfeed {
namespace {

// Every size around the streamed threshold and the 128-byte rounds, from
// and to every offset within a line: the copy equals its source and
// touches nothing around it.
TEST(CopyPastCachesTest, CopiesEveryByteAndNothingElse) {
  constexpr size_t kGuard = 64;
  const std::vector<size_t> sizes = {0,    1,    31,   32,   127,  128,  1023, 1024,
                                     1025, 1055, 1151, 1152, 1153, 4096, 4097, 65536 + 77};
  std::vector<uint8_t> source(70000 + 64);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t size : sizes) {
    for (size_t from : {0, 1, 13, 32, 63}) {
      for (size_t to : {0, 3, 16, 31, 40}) {
        std::vector<uint8_t> destination(size + 2 * kGuard + 64, 0xEE);
        CopyPastCaches(destination.data() + kGuard + to, source.data() + from, size);
        FenceCopiesPastCaches();
        for (size_t i = 0; i < destination.size(); ++i) {
          const bool inside = i >= kGuard + to && i < kGuard + to + size;
          const uint8_t want = inside ? source[from + i - kGuard - to] : 0xEE;
          ASSERT_EQ(destination[i], want)
              << "size " << size << " from +" << from << " to +" << to << " byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace packfeed
