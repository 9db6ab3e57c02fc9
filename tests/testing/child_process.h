#ifndef PACKFEED_TESTS_TESTING_CHILD_PROCESS_H_
#define PACKFEED_TESTS_TESTING_CHILD_PROCESS_H_

// A child process and a control channel to it, for tests and benchmarks that
// need real peers: the child gets one end of a socket pair as fd 3, and both
// sides exchange length-prefixed frames over it.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "packfeed/common/posix_file.h"

namespace packfeed::testing {

// The control fd a child finds its parent on.
inline constexpr int kControlFd = 3;

absl::Status SendFrame(int fd, absl::string_view frame);
// DeadlineExceeded after `timeout`; Unavailable when the peer closed.
absl::StatusOr<std::string> ReceiveFrame(int fd, absl::Duration timeout);

// Move-only. Kills (SIGKILL) and reaps a child still running at destruction.
class ChildProcess {
 public:
  static absl::StatusOr<ChildProcess> Spawn(const std::vector<std::string>& argv);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  absl::Status Send(absl::string_view frame) { return SendFrame(control_.get(), frame); }
  absl::StatusOr<std::string> Receive(absl::Duration timeout = absl::Seconds(60)) {
    return ReceiveFrame(control_.get(), timeout);
  }
  void Kill(int signal);
  // Exit code, or 128 + signal number; DeadlineExceeded if still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

 private:
  ChildProcess(pid_t pid, ScopedFd control) : pid_(pid), control_(std::move(control)) {}
  pid_t pid_ = -1;
  ScopedFd control_;
};

}  // namespace packfeed::testing

#endif  // PACKFEED_TESTS_TESTING_CHILD_PROCESS_H_
