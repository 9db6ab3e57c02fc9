#ifndef PACKFEED_COMMON_DEFAULTS_H_
#define PACKFEED_COMMON_DEFAULTS_H_

// Defaults the daemon, its clients and packfeedctl must agree on, written
// once. The Python package reads them from its native module.

namespace packfeed {

// packfeedd's gRPC Unix socket (systemd: RuntimeDirectory=packfeed).
inline constexpr const char* kDefaultSocketPath = "/run/packfeed/packfeedd.sock";

}  // namespace packfeed

#endif  // PACKFEED_COMMON_DEFAULTS_H_
