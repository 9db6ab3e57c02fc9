#include "packfeed/common/constant_time.h"

#include <cstddef>

namespace packfeed {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t longer = a.size() >= b.size() ? a.size() : b.size();
  for (size_t i = 0; i < longer; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace packfeed
