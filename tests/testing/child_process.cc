#include "child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"

extern char** environ;

namespace packfeed::testing {
namespace {

absl::Status ReadExactly(int fd, char* out, size_t length, absl::Time deadline) {
  while (length > 0) {
    pollfd poll_fd = {fd, POLLIN, 0};
    const int64_t millis = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int ready = poll(&poll_fd, 1, static_cast<int>(millis));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return ErrnoToStatus(errno, "poll", "control socket");
    if (ready == 0) return absl::DeadlineExceededError("no frame from the peer in time");
    const ssize_t got = read(fd, out, length);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoToStatus(errno, "read", "control socket");
    if (got == 0) return absl::UnavailableError("the peer closed the control socket");
    out += got;
    length -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SendFrame(int fd, absl::string_view frame) {
  const uint32_t length = static_cast<uint32_t>(frame.size());
  std::string bytes(reinterpret_cast<const char*>(&length), sizeof(length));
  bytes.append(frame.data(), frame.size());
  return WriteFully(fd, "control socket", bytes);
}

absl::StatusOr<std::string> ReceiveFrame(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  uint32_t length = 0;
  PF_RETURN_IF_ERROR(ReadExactly(fd, reinterpret_cast<char*>(&length), sizeof(length), deadline));
  std::string frame(length, '\0');
  PF_RETURN_IF_ERROR(ReadExactly(fd, frame.data(), length, deadline));
  return frame;
}

absl::StatusOr<ChildProcess> ChildProcess::Spawn(const std::vector<std::string>& argv) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return ErrnoToStatus(errno, "socketpair", "control socket");
  }
  ScopedFd parent_end(fds[0]);
  // Keep the child's end off fd 3 itself: dup2(3, 3) would leave CLOEXEC set.
  ScopedFd child_end(fcntl(fds[1], F_DUPFD_CLOEXEC, 10));
  close(fds[1]);
  if (!child_end.valid()) return ErrnoToStatus(errno, "fcntl", "control socket");

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_end.get(), kControlFd);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return ErrnoToStatus(error, "posix_spawn", argv[0]);
  return ChildProcess(pid, std::move(parent_end));
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), control_(std::move(other.control_)) {}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0) return;
  Kill(SIGKILL);
  waitpid(pid_, nullptr, 0);
}

void ChildProcess::Kill(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no child");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (done < 0 && errno != EINTR) return ErrnoToStatus(errno, "waitpid", "child");
    if (absl::Now() > deadline) return absl::DeadlineExceededError("child still running");
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace packfeed::testing
