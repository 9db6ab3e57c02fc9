// libFuzzer target for packfeedd's configuration: any text must parse to a
// validated configuration or be refused with a status, and a configuration
// that parsed must parse again, from its own text form, to the same message
// (defaults and validation are idempotent).

#include <cstddef>
#include <cstdint>
#include <string>

#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/daemon_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<packfeed::v1::DaemonConfig> config =
      packfeed::server::ParseDaemonConfig(text, "fuzz.textproto");
  if (!config.ok()) return 0;
  std::string again;
  if (!google::protobuf::TextFormat::PrintToString(*config, &again)) __builtin_trap();
  absl::StatusOr<packfeed::v1::DaemonConfig> reparsed =
      packfeed::server::ParseDaemonConfig(again, "again.textproto");
  if (!reparsed.ok() || !google::protobuf::util::MessageDifferencer::Equals(*config, *reparsed)) {
    __builtin_trap();
  }
  return 0;
}
