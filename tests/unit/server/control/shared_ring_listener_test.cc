// The shared-ring door over a real Unix socket, real memfds and, where a
// token's owner matters, a real second process (and, as root, a second uid).

#include "server/control/shared_ring_listener.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/transport/cuda_memory.h"
#include "packfeed/transport/shared_ring.h"
#include "test_paths.h"

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kRingBytes = 4096;
constexpr uid_t kNobody = 65534;

ScopedFd Connect(const std::string& path) {
  ScopedFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  path.copy(address.sun_path, sizeof(address.sun_path) - 1);
  EXPECT_EQ(connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
      << std::strerror(errno);
  return socket;
}

// What the daemon answered on `socket` within `timeout_ms`; "" for nothing.
std::string ReplyOn(int socket, int timeout_ms) {
  pollfd readable{socket, POLLIN, 0};
  if (poll(&readable, 1, timeout_ms) <= 0) return "";
  std::string reply(4096, '\0');
  const ssize_t got = recv(socket, reply.data(), reply.size(), MSG_DONTWAIT);
  reply.resize(got > 0 ? static_cast<size_t>(got) : 0);
  return reply;
}

// Shares a fresh ring as the client does; the daemon's reply.
std::string Share(const std::string& path, const std::string& message = "") {
  absl::StatusOr<transport::SharedRing> ring = transport::SharedRing::Create(kRingBytes);
  EXPECT_TRUE(ring.ok()) << ring.status();
  ScopedFd socket = Connect(path);
  EXPECT_TRUE(
      transport::SendWithFd(socket.get(),
                            message.empty() ? absl::StrCat("packfeed-ring ", kRingBytes) : message,
                            ring->fd())
          .ok());
  return ReplyOn(socket.get(), 10000);
}

std::string TokenOf(const std::string& reply) {
  absl::string_view token = reply;
  EXPECT_TRUE(absl::ConsumePrefix(&token, "token ")) << reply;
  return std::string(token);
}

// Shares a ring from a child process (as `uid` when set); its pid and token.
std::pair<pid_t, std::string> ShareFromChild(const std::string& path, std::optional<uid_t> uid) {
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    if (uid.has_value() && (setgid(*uid) != 0 || setuid(*uid) != 0)) _exit(2);
    const std::string reply = Share(path);
    (void)!write(pipe_fds[1], reply.data(), reply.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string reply(4096, '\0');
  const ssize_t got = read(pipe_fds[0], reply.data(), reply.size());
  reply.resize(got > 0 ? static_cast<size_t>(got) : 0);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return {child, TokenOf(reply)};
}

class SharedRingListenerTest : public ::testing::Test {
 protected:
  std::unique_ptr<SharedRingListener> Start(SharedRingLimits limits = {},
                                            std::set<uid_t> allowed = {}) {
    if (allowed.empty()) allowed = {getuid(), kNobody};
    auto listener = SharedRingListener::Start(path_, std::move(allowed), limits);
    EXPECT_TRUE(listener.ok()) << listener.status();
    // Open to the second uid the root-only cases share from.
    chmod(dir_.path().c_str(), 0755);
    chmod(path_.c_str(), 0666);
    return *std::move(listener);
  }
  testing::ScopedTempDir dir_;
  const std::string path_ = dir_.Prefix("pf.sock.rings");
};

TEST_F(SharedRingListenerTest, ATokenIsTakenOnceByTheProcessThatSharedIt) {
  auto listener = Start();
  const std::string token = TokenOf(Share(path_));
  absl::StatusOr<std::shared_ptr<transport::SharedRing>> ring =
      listener->Take(token, getuid(), getpid());
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ((*ring)->bytes(), kRingBytes);
  absl::StatusOr<std::shared_ptr<transport::SharedRing>> again =
      listener->Take(token, getuid(), getpid());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.status().message(), HasSubstr("taken already"));
  EXPECT_EQ(listener->Take("made-up", getuid(), getpid()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SharedRingListenerTest, AnExpiredTokenIsNotFoundAndItsRingDropped) {
  SharedRingLimits limits;
  limits.token_lifetime = absl::Milliseconds(50);
  auto listener = Start(limits);
  const std::string token = TokenOf(Share(path_));
  EXPECT_EQ(listener->unclaimed(), 1);
  absl::SleepFor(absl::Milliseconds(120));
  EXPECT_EQ(listener->Take(token, getuid(), getpid()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(listener->unclaimed(), 0);
}

TEST_F(SharedRingListenerTest, AnotherProcessCannotTakeARingAndTheOwnerStillCan) {
  auto listener = Start();
  const auto [child, token] = ShareFromChild(path_, std::nullopt);
  absl::StatusOr<std::shared_ptr<transport::SharedRing>> stolen =
      listener->Take(token, getuid(), getpid());
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(stolen.status().message(),
              HasSubstr(absl::StrCat("(pid ", child, ") was given: a token is good only")));
  EXPECT_TRUE(listener->Take(token, getuid(), child).ok());
}

TEST_F(SharedRingListenerTest, AThirdUidCannotTakeARingSharedByAnother) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to share a ring as another uid";
  auto listener = Start();
  const auto [child, token] = ShareFromChild(path_, kNobody);
  // Root holding nobody's token, and nobody's token under a third uid.
  EXPECT_EQ(listener->Take(token, 0, child).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(listener->Take(token, 1, child).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(listener->Take(token, kNobody, child).ok());
}

TEST_F(SharedRingListenerTest, AFloodOfSilentConnectionsDelaysNoRealClient) {
  SharedRingLimits limits;
  limits.receive_timeout = absl::Seconds(30);  // longer than the test
  limits.max_pending = 32;
  limits.max_pending_per_uid = 1000;
  auto listener = Start(limits);
  std::vector<ScopedFd> silent;
  for (int i = 0; i < 200; ++i) silent.push_back(Connect(path_));
  // Served while silent ones still wait (the old door served one at a time,
  // each silent one holding it for its whole timeout).
  const std::string reply = Share(path_);
  EXPECT_THAT(reply, StartsWith("token "));
  EXPECT_TRUE(listener->Take(TokenOf(reply), getuid(), getpid()).ok());
  // The oldest were closed to bound what waits, with the reason.
  EXPECT_THAT(ReplyOn(silent.front().get(), 5000), HasSubstr("too many connections waiting"));
  // The newest still wait, answered nothing.
  EXPECT_EQ(ReplyOn(silent.back().get(), 0), "");
}

TEST_F(SharedRingListenerTest, PendingConnectionsAreBoundedPerUid) {
  SharedRingLimits limits;
  limits.receive_timeout = absl::Seconds(30);
  limits.max_pending_per_uid = 4;
  auto listener = Start(limits);
  std::vector<ScopedFd> silent;
  for (int i = 0; i < 5; ++i) silent.push_back(Connect(path_));
  EXPECT_THAT(ReplyOn(silent.front().get(), 5000),
              HasSubstr("its uid has too many connections waiting"));
  EXPECT_EQ(ReplyOn(silent[1].get(), 0), "");
}

TEST_F(SharedRingListenerTest, ASilentConnectionIsClosedAtItsTimeout) {
  SharedRingLimits limits;
  limits.receive_timeout = absl::Milliseconds(100);
  auto listener = Start(limits);
  ScopedFd silent = Connect(path_);
  EXPECT_THAT(ReplyOn(silent.get(), 5000), HasSubstr("sent no ring within 100ms"));
}

TEST_F(SharedRingListenerTest, UnclaimedRingsAreBoundedPerUidAndInAll) {
  SharedRingLimits limits;
  limits.max_unclaimed_per_uid = 3;
  limits.max_unclaimed = 4;
  auto listener = Start(limits);
  std::vector<std::string> tokens;
  for (int i = 0; i < 3; ++i) tokens.push_back(TokenOf(Share(path_)));
  const std::string refused = Share(path_);
  EXPECT_THAT(refused, StartsWith("error "));
  EXPECT_THAT(refused, HasSubstr("too many rings shared and not attached (3 of this uid"));
  // Another process of the same uid shares the same quota; taking one frees
  // a place.
  ASSERT_TRUE(listener->Take(tokens[0], getuid(), getpid()).ok());
  EXPECT_THAT(Share(path_), StartsWith("token "));
  EXPECT_EQ(listener->unclaimed(), 3);
  if (geteuid() == 0) {
    // Another uid has a quota of its own, up to the bound in all.
    const auto [child, token] = ShareFromChild(path_, kNobody);
    EXPECT_FALSE(token.empty());
    EXPECT_EQ(listener->unclaimed(), 4);
    EXPECT_THAT(Share(path_), HasSubstr("4 in all, at most 4"));
  }
}

// A ring larger than the bound, or one past what all unclaimed rings may
// take, is refused before it is mapped: no peer takes the daemon's address
// space. (Offers are checked against the memfd's own size as well.)
TEST_F(SharedRingListenerTest, RingBytesAreBoundedEachAndInAll) {
  SharedRingLimits limits;
  limits.max_ring_bytes = kRingBytes;
  limits.max_unclaimed_bytes = 2 * kRingBytes;
  auto listener = Start(limits);
  const std::string one = TokenOf(Share(path_));
  EXPECT_THAT(Share(path_, absl::StrCat("packfeed-ring ", kRingBytes + 1)),
              HasSubstr(absl::StrCat("a ring of ", kRingBytes + 1, " bytes: at most ", kRingBytes,
                                     " (config max_shared_ring_bytes)")));
  EXPECT_THAT(Share(path_, "packfeed-ring 18446744073709551615"), HasSubstr("at most"));
  EXPECT_THAT(Share(path_), StartsWith("token "));
  EXPECT_THAT(Share(path_), HasSubstr(absl::StrCat("(", 2 * kRingBytes, " now)")));
  EXPECT_EQ(listener->unclaimed(), 2);
  ASSERT_TRUE(listener->Take(one, getuid(), getpid()).ok());
  EXPECT_THAT(Share(path_), StartsWith("token "));
}

TEST_F(SharedRingListenerTest, RefusesAStrangerAndAMalformedMessage) {
  auto strangers_only = Start({}, {kNobody + 1});
  EXPECT_THAT(Share(path_), HasSubstr("may not attach (it shared a ring)"));
  strangers_only.reset();
  auto listener = Start();
  EXPECT_THAT(Share(path_, "hello"), HasSubstr("not \"packfeed-ring BYTES\""));
  EXPECT_THAT(Share(path_, "packfeed-ring 8192"), StartsWith("error "));  // size mismatch
  EXPECT_THAT(Share(path_, "packfeed-device-ring 4096 GPU-0"),
              HasSubstr("the UUID as 32 lowercase hex digits"));
  EXPECT_EQ(listener->unclaimed(), 0);
}

// A device ring the daemon cannot import (here: no GPU at all, or none of
// that UUID) is refused with the reason, which the client reports when it
// falls back to its staged ring; the daemon keeps nothing of it.
TEST_F(SharedRingListenerTest, ADeviceRingItCannotImportIsRefusedWithTheReason) {
  auto listener = Start();
  const std::string reply =
      Share(path_, absl::StrCat("packfeed-device-ring ", kRingBytes, " ", std::string(32, 'a')));
  EXPECT_THAT(reply, StartsWith("error "));
  EXPECT_THAT(reply, HasSubstr("device ring: "));
  if (transport::CudaDeviceCount() == 0) {
    EXPECT_THAT(reply, ::testing::AnyOf(HasSubstr("no CUDA device"),
                                        HasSubstr("built without the CUDA toolkit")));
  } else {
    EXPECT_THAT(reply, HasSubstr("no GPU with UUID aaaa"));
  }
  EXPECT_EQ(listener->unclaimed(), 0);
}

}  // namespace
}  // namespace packfeed::server
