#ifndef PACKFEED_COMMON_DEFAULTS_H_
#define PACKFEED_COMMON_DEFAULTS_H_

// Defaults the daemon, its clients and packfeedctl must agree on, written
// once. The Python package reads them from its native module.

namespace packfeed {

// packfeedd's gRPC Unix socket (systemd: RuntimeDirectory=packfeed).
inline constexpr const char* kDefaultSocketPath = "/run/packfeed/packfeedd.sock";

// Seconds a client keeps re-attaching to a daemon that went away: long
// enough for systemd to restart it and for its start-up checks (datasets,
// peers), short enough that a rank of a node whose daemon is gone for good
// fails its step within a minute.
inline constexpr int kDefaultReconnectSeconds = 60;

}  // namespace packfeed

#endif  // PACKFEED_COMMON_DEFAULTS_H_
