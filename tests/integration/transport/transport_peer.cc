// The far end of the transport tests: a receiver, a sender, or a "rogue"
// sender that sends whatever bytes the test gives it. Driven by its parent
// over the control socket on fd 3 (tests/testing/child_process.h):
//
//   receiver: sends its worker address and ring descriptor, then serves
//     "connect <id>" + <sender address>      -> "ok" | "<CODE>: <message>"
//     "receive <first_seq> <count>"             -> "ok <bytes>" | "<CODE>: ..."
//   sender: sends its worker address, then serves
//     "connect" + <receiver address> + <ring>   -> "connection <id>" | "<CODE>: ..."
//     "push <id> <first_seq> <count>"        -> "ok" | "<CODE>: ..."
//   rogue: sends its worker address, then serves
//     "connect" + <receiver address>            -> "ok"
//     "send" + <bytes>                          -> "sent" (one eager message)
//   every role: "quit".

#include <grp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "child_process.h"
#include "packfeed/transport/receiver.h"
#include "packfeed/transport/sender.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/transport/ucx_endpoint.h"
#include "packfeed/transport/ucx_status.h"
#include "transport_harness.h"

namespace packfeed::testing {
namespace {

using transport::UcxOptions;

struct PeerFlags {
  std::string role;
  std::string transports;
  uint32_t slots = 3;
  uint64_t slot_bytes = 0;
  uint64_t max_payload = 0;
  int hold_ms = 0;
  int uid = -1;             // run as this uid (and gid), from root
  std::string ring_socket;  // receiver: share the ring's memfd through this socket
};

[[noreturn]] void Die(const absl::Status& status) {
  fprintf(stderr, "transport_peer: %s\n", StatusLine(status).c_str());
  std::exit(2);
}

std::string Next() {
  absl::StatusOr<std::string> frame = ReceiveFrame(kControlFd, absl::Minutes(10));
  if (!frame.ok()) std::exit(0);  // the parent is gone: so are we
  return *frame;
}

void Reply(const std::string& line) {
  absl::Status status = SendFrame(kControlFd, line);
  if (!status.ok()) Die(status);
}

std::string OkOr(const absl::Status& status, const std::string& ok) {
  return status.ok() ? ok : StatusLine(status);
}

uint64_t Number(absl::string_view text) {
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) Die(absl::InvalidArgumentError(std::string(text)));
  return value;
}

void RunReceiver(const PeerFlags& flags) {
  transport::ReceiverOptions options;
  options.ucx.transports = flags.transports;
  options.slots = flags.slots;
  options.slot_bytes = flags.slot_bytes;
  options.placement = transport::RingPlacement::kHost;
  options.shared_by_fd = !flags.ring_socket.empty();
  auto receiver = transport::Receiver::Create(options);
  if (!receiver.ok()) Die(receiver.status());
  Reply((*receiver)->worker_address());
  Reply((*receiver)->ring_descriptor());
  if (options.shared_by_fd) {
    ScopedFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    flags.ring_socket.copy(address.sun_path, sizeof(address.sun_path) - 1);
    if (connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
      Die(ErrnoToStatus(errno, "connect", flags.ring_socket));
    }
    absl::Status sent =
        transport::SendWithFd(socket.get(), "packfeed-ring", (*receiver)->ring_fd());
    if (!sent.ok()) Die(sent);
  }
  while (true) {
    const std::string line = Next();
    const std::vector<std::string> command = absl::StrSplit(line, ' ');
    if (command[0] == "connect") {
      const std::string address = Next();
      absl::StatusOr<PeerConnection> connection =
          ParseConnection(absl::string_view(line).substr(command[0].size() + 1));
      if (!connection.ok()) Die(connection.status());
      Reply(OkOr((*receiver)->Connect(address, connection->id, connection->key), "ok"));
    } else if (command[0] == "receive") {
      uint64_t bytes = 0;
      absl::Status status =
          ReceiveTestMessages(**receiver, Number(command.at(1)), Number(command.at(2)),
                              flags.max_payload, absl::Milliseconds(flags.hold_ms), &bytes);
      Reply(OkOr(status, absl::StrCat("ok ", bytes)));
    } else {
      return;
    }
  }
}

void RunSender(const PeerFlags& flags) {
  transport::SenderOptions options;
  options.ucx.transports = flags.transports;
  auto sender = transport::Sender::Create(options);
  if (!sender.ok()) Die(sender.status());
  Reply((*sender)->worker_address());
  while (true) {
    const std::vector<std::string> command = absl::StrSplit(Next(), ' ');
    if (command[0] == "connect") {
      const std::string address = Next();
      const std::string ring = Next();
      absl::StatusOr<uint64_t> connection_id = (*sender)->Connect(address, ring);
      Reply(connection_id.ok() ? ConnectionReply(*connection_id, *(*sender)->Key(*connection_id))
                               : StatusLine(connection_id.status()));
    } else if (command[0] == "push") {
      PushReport report;
      absl::Status status = PushTestMessages(**sender, Number(command.at(1)), Number(command.at(2)),
                                             Number(command.at(3)), flags.max_payload, &report);
      Reply(OkOr(status, "ok"));
    } else {
      return;
    }
  }
}

ucs_status_t IgnoreMessage(void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
  return UCS_OK;
}

void RunRogue(const PeerFlags& flags) {
  UcxOptions ucx;
  ucx.transports = flags.transports;
  auto context = transport::UcpContext::Create(ucx);
  if (!context.ok()) Die(context.status());
  auto worker = transport::UcpWorker::Create(*context);
  if (!worker.ok()) Die(worker.status());
  if (absl::Status status =
          worker->SetMessageHandler(transport::kActiveMessageId, &IgnoreMessage, nullptr);
      !status.ok()) {
    Die(status);
  }
  Reply(transport::EncodeWorkerAddress(worker->address()));
  std::optional<transport::UcpEndpoint> endpoint;
  while (true) {
    const std::string command = Next();
    if (command == "connect") {
      auto address = transport::DecodeWorkerAddress(Next());
      if (!address.ok()) Die(address.status());
      auto connected = transport::UcpEndpoint::Connect(
          *worker, *address, [](void*, ucp_ep_h, ucs_status_t) {}, nullptr);
      if (!connected.ok()) Die(connected.status());
      endpoint.emplace(std::move(*connected));
      Reply("ok");
    } else if (command == "send") {
      const std::string bytes = Next();
      absl::Status status =
          worker->Wait(endpoint->SendEager(transport::kActiveMessageId, bytes), "ucp_am_send_nbx");
      status.Update(worker->Wait(endpoint->Flush(), "ucp_ep_flush_nbx"));
      Reply(OkOr(status, "sent"));
    } else if (command == "send-slot") {
      const std::string header = Next();
      std::string data = Next();
      const std::vector<ucp_dt_iov_t> pieces = {{data.data(), data.size()}};
      absl::Status status = worker->Wait(
          endpoint->SendEager(transport::kSlotDataMessageId, header, pieces), "ucp_am_send_nbx");
      status.Update(worker->Wait(endpoint->Flush(), "ucp_ep_flush_nbx"));
      Reply(OkOr(status, "sent"));
    } else {
      return;
    }
  }
}

}  // namespace
}  // namespace packfeed::testing

int main(int argc, char** argv) {
  packfeed::testing::PeerFlags flags;
  CLI::App app{"transport test peer"};
  app.add_option("--role", flags.role)
      ->required()
      ->check(CLI::IsMember({"receiver", "sender", "rogue"}));
  app.add_option("--tls", flags.transports);
  app.add_option("--slots", flags.slots);
  app.add_option("--slot-bytes", flags.slot_bytes);
  app.add_option("--max-payload", flags.max_payload);
  app.add_option("--hold-ms", flags.hold_ms);
  app.add_option("--uid", flags.uid);
  app.add_option("--ring-socket", flags.ring_socket);
  CLI11_PARSE(app, argc, argv);
  if (flags.uid >= 0 &&
      (setgroups(0, nullptr) != 0 || setgid(flags.uid) != 0 || setuid(flags.uid) != 0)) {
    packfeed::testing::Die(packfeed::ErrnoToStatus(errno, "setuid", absl::StrCat(flags.uid)));
  }
  if (flags.role == "receiver") packfeed::testing::RunReceiver(flags);
  if (flags.role == "sender") packfeed::testing::RunSender(flags);
  if (flags.role == "rogue") packfeed::testing::RunRogue(flags);
  return 0;
}
