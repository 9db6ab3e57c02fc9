// Links the installed client library and prints what it was built with.
#include <cstdio>

#include "packfeed/client/client.h"
#include "packfeed/common/version.h"

int main() {
  packfeed::client::ClientOptions options;
  std::printf("packfeed %s, default socket %s\n", packfeed::kPackfeedVersion,
              options.socket_path.c_str());
  // No daemon listens here: attaching must fail cleanly, not crash.
  options.socket_path = "/nonexistent/packfeedd.sock";
  options.job = "demo";
  options.attach_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<packfeed::client::Client>> client =
      packfeed::client::Client::Attach(options);
  std::printf("attach without a daemon: %s\n", client.status().ToString().c_str());
  return client.ok() ? 1 : 0;
}
