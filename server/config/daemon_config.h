#ifndef PACKFEED_SERVER_CONFIG_DAEMON_CONFIG_H_
#define PACKFEED_SERVER_CONFIG_DAEMON_CONFIG_H_

// packfeedd's configuration: protobuf text format (proto/packfeed/v1/
// config.proto), parsed and validated before anything is served. Every error
// names the file, and the field by its path ("jobs[1].topology.cp").

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/common/defaults.h"

namespace packfeed::v1 {
class DaemonConfig;
class JobConfig;
}  // namespace packfeed::v1

namespace packfeed::server {

// Parses `text`; `source` names it in errors (a path). InvalidArgument with
// the line and column of a syntax error, or the path of an invalid field.
// Fills defaults (documented in config.proto) into the result.
absl::StatusOr<v1::DaemonConfig> ParseDaemonConfig(absl::string_view text,
                                                   absl::string_view source);

// Reads and parses `path`; NotFound when it is missing.
absl::StatusOr<v1::DaemonConfig> LoadDaemonConfig(const std::string& path);

// Checks one job alone (what ParseDaemonConfig checks per job); `where`
// prefixes field paths. Dataset files are not opened here.
absl::Status ValidateJobConfig(const v1::JobConfig& job, absl::string_view where);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONFIG_DAEMON_CONFIG_H_
