#ifndef PACKFEED_SERVER_CTL_EXIT_CODE_H_
#define PACKFEED_SERVER_CTL_EXIT_CODE_H_

#include <cstdio>

#include "absl/status/status.h"

namespace packfeed::server::ctl {

// The process exit code for a command's outcome; prints the error (code and
// message) to stderr when there is one.
inline int ExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "packfeedctl: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace packfeed::server::ctl

#endif  // PACKFEED_SERVER_CTL_EXIT_CODE_H_
