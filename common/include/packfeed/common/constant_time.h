#ifndef PACKFEED_COMMON_CONSTANT_TIME_H_
#define PACKFEED_COMMON_CONSTANT_TIME_H_

// The one comparison of secrets (job and stream tokens, connection keys):
// its time depends on the lengths only, never on where the bytes differ,
// so a caller cannot learn a secret byte by byte from how fast a wrong one
// is refused.

#include "absl/strings/string_view.h"

namespace packfeed {

// Whether `a` and `b` hold the same bytes. The lengths may leak; the
// contents do not.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace packfeed

#endif  // PACKFEED_COMMON_CONSTANT_TIME_H_
