// The C++ client's contracts that need no daemon: what Attach says when
// there is none to attach to, and the trainer-time arithmetic. What it does
// against a real packfeedd (every refusal, held microbatches, the ring never
// running dry) is daemon_bad_input_test's; reconnects are the Python
// reliability tests'.

#include "packfeed/client/client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::client {
namespace {

using ::testing::HasSubstr;

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("pf-client-test-", ::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string ScratchSocket(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

ClientOptions OptionsFor(const std::string& socket) {
  ClientOptions options;
  options.socket_path = socket;
  options.job = "job";
  options.attach_timeout = absl::Seconds(1);
  options.reconnect_timeout = absl::ZeroDuration();
  return options;
}

TEST_F(ClientTest, AttachWithoutAJobNameIsInvalidArgument) {
  ClientOptions options = OptionsFor(ScratchSocket("unused.sock"));
  options.job.clear();
  const absl::Status attached = Client::Attach(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(attached)) << attached;
  EXPECT_THAT(attached.message(), HasSubstr("ClientOptions.job is required"));
}

TEST_F(ClientTest, AttachWhereNoDaemonListensIsUnavailableNamingTheSocketWithinItsTimeout) {
  const std::string socket = ScratchSocket("nobody.sock");
  const absl::Time start = absl::Now();
  const absl::Status attached = Client::Attach(OptionsFor(socket)).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(attached)) << attached;
  EXPECT_THAT(attached.message(), HasSubstr(socket));
}

// gRPC would say only that it failed to create a channel.
TEST_F(ClientTest, ASocketPathTooLongForUnixIsInvalidArgumentNamingTheLimit) {
  const std::string socket = "/tmp/" + std::string(120, 'x') + ".sock";
  const absl::Status attached = Client::Attach(OptionsFor(socket)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(attached)) << attached;
  EXPECT_THAT(attached.message(), HasSubstr("longer than a Unix socket path may be (107 bytes)"));
}

// Something listens on the socket but is not a daemon: it takes the
// connection and never speaks gRPC.
TEST_F(ClientTest, AttachToASocketThatIsNotADaemonIsUnavailableWithinItsTimeout) {
  const std::string path = ScratchSocket("silent.sock");
  const int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  path.copy(address.sun_path, sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  const absl::Time start = absl::Now();
  const absl::Status attached = Client::Attach(OptionsFor(path)).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(attached)) << attached;
  EXPECT_THAT(attached.message(), HasSubstr(absl::StrCat("no packfeedd answers on ", path)));
  ::close(listener);
}

TEST(TrainerTimesTest, InputBoundIsTheShareOfTimeSpentWaiting) {
  TrainerTimes times;
  EXPECT_EQ(times.input_bound(), 0.0) << "no time measured yet";
  times.waited = absl::Milliseconds(250);
  times.busy = absl::Milliseconds(750);
  EXPECT_DOUBLE_EQ(times.input_bound(), 0.25);
}

}  // namespace
}  // namespace packfeed::client
