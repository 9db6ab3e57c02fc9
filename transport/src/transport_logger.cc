#include "packfeed/transport/transport_logger.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace packfeed::transport {

spdlog::logger& Logger() {
  // Held here too, so a host program's spdlog::drop_all() cannot free it.
  static const std::shared_ptr<spdlog::logger> logger = [] {
    std::shared_ptr<spdlog::logger> existing = spdlog::get("packfeed.transport");
    return existing != nullptr ? existing : spdlog::stderr_logger_mt("packfeed.transport");
  }();
  return *logger;
}

}  // namespace packfeed::transport
