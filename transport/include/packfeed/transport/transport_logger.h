#ifndef PACKFEED_TRANSPORT_TRANSPORT_LOGGER_H_
#define PACKFEED_TRANSPORT_TRANSPORT_LOGGER_H_

#include <spdlog/spdlog.h>

namespace packfeed::transport {

// The logger of code that runs inside trainers ("packfeed.transport"). It is
// registered with spdlog so a host program can set its level or sinks, but it
// never replaces or writes through spdlog's default logger.
spdlog::logger& Logger();

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_TRANSPORT_LOGGER_H_
