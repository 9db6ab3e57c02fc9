#ifndef PACKFEED_SERVER_CONTROL_PEER_FORWARD_H_
#define PACKFEED_SERVER_CONTROL_PEER_FORWARD_H_

// Hands every step sealed on this daemon (the origin) to every peer daemon
// (docs/INGEST.md, Several nodes): its samples' lengths, groups and tags,
// and where their bytes lie in this daemon's registered memory. Each peer
// plans the step and gets only the samples its own ranks are planned
// (Admin.ForwardStep over the peers' TCP admin listeners).
//
// The origin keeps the step (pinned in its stream) until every peer's
// ranks consumed it, not only until every peer has it: a peer that
// restarts alone loses what it held. A sync thread asks each peer what it
// holds and how far its consumer jobs got (Admin.IngestStatus) every
// sync_interval_ms, forwards a step again to a peer found without it, and
// unpins a step every peer consumed.
//
// Thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "packfeed/v1/config.pb.h"
#include "packfeed/v1/service.grpc.pb.h"
#include "server/ingest/ingest_stream.h"

namespace packfeed::server {

// The request that forwards `step` of `stream`: its samples in serving
// order, one put per run of samples in the same registered region, each
// allowed to wait `room_wait_ms` for room on the peer. FailedPrecondition
// for a step this daemon got from a peer (its samples are not in
// registered memory, some not here at all).
absl::StatusOr<v1::ForwardStepRequest> ForwardRequestOf(const IngestStream& stream,
                                                        const SealedStep& step,
                                                        const std::string& auth_token,
                                                        uint32_t room_wait_ms);

class PeerForwarder {
 public:
  // nullptr when `config` has no peers.
  static absl::StatusOr<std::unique_ptr<PeerForwarder>> Create(const v1::DaemonConfig& config);
  ~PeerForwarder() { Stop(); }

  // Answers every seal still waiting (naming the peers without its step),
  // cancels the forwards under way and stops the sync thread. Repeatable.
  void Stop();

  // Takes over the pin of `step`, sealed (and pinned once) in `stream` just
  // now: forwards it to every peer and keeps it pinned until every peer's
  // ranks consumed it. `answered` runs (on another thread) once every peer
  // has the step, with no peers, or after seal_wait_ms with the peers that
  // do not have it yet. An error (the pin released) when the step cannot
  // be forwarded at all.
  absl::Status Hand(IngestStream& stream, int64_t step, const std::string& auth_token,
                    std::function<void(std::vector<std::string> peers_behind)> answered);

  // What a driver that seals `step` again is told, given the stream's
  // `already` (AlreadyExists): FailedPrecondition for a step forwarded
  // here by a peer, `already` naming the peers still without the step
  // (which are asked again at once), or `already` as it is.
  absl::Status SealedAgain(const IngestStream& stream, int64_t step, absl::Status already);

 private:
  enum class PeerHas { kNothing, kForwarding, kStep, kConsumed };
  struct Peer {
    std::string address;
    std::unique_ptr<v1::Admin::Stub> stub;
    bool reachable = true;  // as the last sync found it (for the log)
  };
  struct Waiter {
    absl::Time deadline;
    std::function<void(std::vector<std::string>)> answered;
  };
  // A step sealed here that some peer's ranks have not consumed yet.
  struct Handed {
    IngestStream* stream = nullptr;
    std::shared_ptr<const v1::ForwardStepRequest> request;
    std::vector<PeerHas> peers;  // by index into peers_
    std::vector<Waiter> waiters;
  };
  using Key = std::pair<std::string, int64_t>;  // stream, step
  // A peer's view of one stream, from Admin.IngestStatus.
  struct PeerStream {
    int64_t consumed_before = 0;
    std::vector<int64_t> sealed;  // sorted
  };
  // Work found under the lock, done after it.
  struct Actions {
    std::vector<std::pair<size_t, std::shared_ptr<const v1::ForwardStepRequest>>> forwards;
    std::vector<std::pair<IngestStream*, int64_t>> unpins;
    std::vector<std::pair<std::function<void(std::vector<std::string>)>, std::vector<std::string>>>
        answers;
  };

  PeerForwarder(std::vector<Peer> peers, std::string admin_token, v1::IngestPeerTimes times);

  void SyncLoop();
  // Asks peer `p` about every stream it still has steps of to consume.
  void SyncPeer(size_t p, Actions& actions);
  absl::StatusOr<PeerStream> AskPeer(Peer& peer, const std::string& stream);
  void SendForward(size_t p, std::shared_ptr<const v1::ForwardStepRequest> request);
  void Forwarded(size_t p, const Key& key, const grpc::Status& status,
                 const v1::ForwardStepReply& reply);
  // Answers the waiters of `handed` once every peer has it (or with those
  // without it, past the deadline); drops `it` once every peer consumed it.
  void Settle(std::map<Key, Handed>::iterator it, absl::Time now, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Run(Actions actions);

  std::vector<Peer> peers_;  // reachable: sync thread only
  const std::string admin_token_;
  const v1::IngestPeerTimes times_;

  absl::Mutex mutex_;
  std::map<Key, Handed> handed_ ABSL_GUARDED_BY(mutex_);
  // Forwards under way, so that Stop can cancel them and wait for them.
  std::map<uint64_t, std::shared_ptr<grpc::ClientContext>> calls_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_call_ ABSL_GUARDED_BY(mutex_) = 0;
  bool sync_now_ ABSL_GUARDED_BY(mutex_) = false;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread sync_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_PEER_FORWARD_H_
