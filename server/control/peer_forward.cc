#include "server/control/peer_forward.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/proto/grpc_status.h"
#include "server/control/peer_admin.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

absl::StatusOr<v1::ForwardStepRequest> ForwardRequestOf(const IngestStream& stream,
                                                        const SealedStep& step,
                                                        const std::string& auth_token,
                                                        uint32_t room_wait_ms) {
  v1::ForwardStepRequest request;
  request.set_stream(stream.name());
  request.set_step(step.step);
  const SampleRegion* region = nullptr;
  v1::PutRequest* put = nullptr;
  for (const IngestedSample& sample : step.samples) {
    if (sample.region == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("ingest stream ", stream.name(), " step ", step.step,
                       " was forwarded to this daemon by a peer; seal it where it was put"));
    }
    if (put == nullptr || sample.region.get() != region) {
      region = sample.region.get();
      put = request.add_puts();
      put->set_stream(stream.name());
      put->set_auth_token(auth_token);
      put->set_step(step.step);
      put->set_timeout_ms(room_wait_ms);
      for (const SideFieldInfo& field : stream.fields()) put->add_fields(field.name);
      v1::IngestRegion* described = put->mutable_region();
      described->set_worker_address(region->worker_address);
      described->set_remote_key(region->remote_key);
      described->set_address(region->address);
      described->set_length(region->length);
    }
    v1::IngestSample* out = put->add_samples();
    const uint64_t offset = reinterpret_cast<uint64_t>(sample.data.get()) - region->address;
    out->set_group(sample.group);
    out->set_tag(sample.tag);
    out->set_offset(offset);
    out->set_tokens(static_cast<uint64_t>(sample.num_tokens));
    for (size_t f = 0; f < stream.fields().size(); ++f) {
      out->add_field_offsets(offset + sample.field_offsets[f]);
      out->add_field_bytes(static_cast<uint64_t>(sample.num_tokens) *
                           stream.fields()[f].row_bytes());
    }
  }
  return request;
}

absl::StatusOr<std::unique_ptr<PeerForwarder>> PeerForwarder::Create(
    const v1::DaemonConfig& config) {
  if (config.peers().empty()) return nullptr;
  // A call fails at once while its peer is down (the next sync asks again);
  // a peer back is reconnected to within a second.
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  PF_ASSIGN_OR_RETURN(std::vector<PeerAdmin> admins, PeerAdmins(config, arguments));
  std::vector<Peer> peers;
  for (PeerAdmin& admin : admins)
    peers.push_back({std::move(admin.address), std::move(admin.stub)});
  return std::unique_ptr<PeerForwarder>(
      new PeerForwarder(std::move(peers), config.admin_tcp_token(), config.ingest_peers()));
}

PeerForwarder::PeerForwarder(std::vector<Peer> peers, std::string admin_token,
                             v1::IngestPeerTimes times)
    : peers_(std::move(peers)), admin_token_(std::move(admin_token)), times_(std::move(times)) {
  sync_ = std::thread(&PeerForwarder::SyncLoop, this);
}

void PeerForwarder::Stop() {
  Actions actions;
  {
    absl::MutexLock lock(&mutex_);
    if (stop_) return;
    stop_ = true;
    for (auto it = handed_.begin(); it != handed_.end();) {
      Settle(it++, absl::InfiniteFuture(), actions);
    }
    for (auto& [_, call] : calls_) call->TryCancel();
  }
  Run(std::move(actions));
  if (sync_.joinable()) sync_.join();
  absl::MutexLock lock(&mutex_);
  mutex_.Await(absl::Condition(
      +[](std::map<uint64_t, std::shared_ptr<grpc::ClientContext>>* calls) {
        return calls->empty();
      },
      &calls_));
}

absl::Status PeerForwarder::Hand(IngestStream& stream, int64_t step, const std::string& auth_token,
                                 std::function<void(std::vector<std::string>)> answered) {
  absl::StatusOr<std::shared_ptr<const SealedStep>> sealed = stream.Sealed(step);
  absl::StatusOr<v1::ForwardStepRequest> request =
      sealed.ok() ? ForwardRequestOf(stream, **sealed, auth_token, times_.room_wait_ms())
                  : absl::StatusOr<v1::ForwardStepRequest>(sealed.status());
  if (!request.ok()) {
    stream.Unpin(step);
    return request.status();
  }
  auto shared = std::make_shared<const v1::ForwardStepRequest>(*std::move(request));
  {
    absl::MutexLock lock(&mutex_);
    if (stop_) {
      stream.Unpin(step);
      return absl::UnavailableError("the daemon is stopping");
    }
    Handed& handed = handed_[{stream.name(), step}];
    handed.stream = &stream;
    handed.request = shared;
    handed.peers.assign(peers_.size(), PeerHas::kForwarding);
    handed.waiters.push_back(
        {absl::Now() + absl::Milliseconds(times_.seal_wait_ms()), std::move(answered)});
  }
  for (size_t p = 0; p < peers_.size(); ++p) SendForward(p, shared);
  return absl::OkStatus();
}

absl::Status PeerForwarder::SealedAgain(const IngestStream& stream, int64_t step,
                                        absl::Status already) {
  std::vector<std::string> behind;
  {
    absl::MutexLock lock(&mutex_);
    auto it = handed_.find({stream.name(), step});
    if (it != handed_.end()) {
      for (size_t p = 0; p < peers_.size(); ++p) {
        if (it->second.peers[p] < PeerHas::kStep) behind.push_back(peers_[p].address);
      }
      sync_now_ = !behind.empty();
    }
  }
  if (!behind.empty()) {
    return absl::AlreadyExistsError(
        absl::StrCat(already.message(), "; peers ", absl::StrJoin(behind, ", "),
                     " do not have it yet: it is forwarded to them as they answer"));
  }
  absl::StatusOr<std::shared_ptr<const SealedStep>> sealed = stream.Sealed(step);
  if (sealed.ok() && !(*sealed)->samples.empty() && (*sealed)->samples[0].region == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("ingest stream ", stream.name(), " step ", step,
                     " was forwarded to this daemon by a peer; seal it where it was put"));
  }
  return already;
}

void PeerForwarder::SendForward(size_t p, std::shared_ptr<const v1::ForwardStepRequest> request) {
  struct Call {
    std::shared_ptr<grpc::ClientContext> context = std::make_shared<grpc::ClientContext>();
    v1::ForwardStepReply reply;
  };
  auto call = std::make_shared<Call>();
  PeerCall(*call->context, admin_token_, std::chrono::milliseconds(times_.forward_timeout_ms()));
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mutex_);
    if (stop_) return;  // Stop cancelled the calls under way; none begins after
    id = next_call_++;
    calls_[id] = call->context;
  }
  Key key{request->stream(), request->step()};
  peers_[p].stub->async()->ForwardStep(
      call->context.get(), request.get(), &call->reply,
      [this, p, id, key = std::move(key), call, request](grpc::Status status) {
        Forwarded(p, key, status, call->reply);
        absl::MutexLock lock(&mutex_);
        calls_.erase(id);
      });
}

void PeerForwarder::Forwarded(size_t p, const Key& key, const grpc::Status& status,
                              const v1::ForwardStepReply& reply) {
  const std::string& peer = peers_[p].address;
  if (status.ok()) {
    spdlog::info("ingest stream {}: step {} forwarded to peer {}: {}", key.first, key.second, peer,
                 reply.held_already() ? std::string("held there already")
                                      : absl::StrCat(reply.samples_fetched(), " of ",
                                                     reply.samples(), " samples fetched"));
  } else {
    spdlog::warn(
        "ingest stream {}: forwarding step {} to peer {} failed ({}); it is sent again "
        "once the peer answers",
        key.first, key.second, peer, status.error_message());
  }
  Actions actions;
  {
    absl::MutexLock lock(&mutex_);
    auto it = handed_.find(key);
    if (it == handed_.end()) return;
    PeerHas& has = it->second.peers[p];
    if (has == PeerHas::kForwarding) has = status.ok() ? PeerHas::kStep : PeerHas::kNothing;
    Settle(it, absl::Now(), actions);
  }
  Run(std::move(actions));
}

void PeerForwarder::Settle(std::map<Key, Handed>::iterator it, absl::Time now, Actions& actions) {
  Handed& handed = it->second;
  std::vector<std::string> behind;
  bool consumed = true;
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (handed.peers[p] < PeerHas::kStep) behind.push_back(peers_[p].address);
    consumed = consumed && handed.peers[p] == PeerHas::kConsumed;
  }
  for (auto waiter = handed.waiters.begin(); waiter != handed.waiters.end();) {
    if (!behind.empty() && now < waiter->deadline) {
      ++waiter;
      continue;
    }
    if (!behind.empty()) {
      spdlog::warn(
          "ingest stream {}: step {} sealed, but peers {} did not take it within {} ms; "
          "it is kept here and forwarded to them as they answer",
          it->first.first, it->first.second, absl::StrJoin(behind, ", "), times_.seal_wait_ms());
    }
    actions.answers.emplace_back(std::move(waiter->answered), behind);
    waiter = handed.waiters.erase(waiter);
  }
  if (consumed && handed.waiters.empty()) {
    actions.unpins.emplace_back(handed.stream, it->first.second);
    handed_.erase(it);
  }
}

void PeerForwarder::Run(Actions actions) {
  for (auto& [answered, behind] : actions.answers) answered(std::move(behind));
  for (auto& [p, request] : actions.forwards) SendForward(p, std::move(request));
  for (auto& [stream, step] : actions.unpins) stream->Unpin(step);
}

void PeerForwarder::SyncLoop() {
  absl::Time next_sync = absl::Now();
  while (true) {
    Actions actions;
    bool sync = false;
    {
      absl::MutexLock lock(&mutex_);
      // Wakes for a stop, a seal again, the next sync or the earliest
      // seal's deadline.
      absl::Time wake = next_sync;
      for (const auto& [_, handed] : handed_) {
        for (const Waiter& waiter : handed.waiters) wake = std::min(wake, waiter.deadline);
      }
      mutex_.AwaitWithDeadline(absl::Condition(
                                   +[](PeerForwarder* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                     return self->stop_ || self->sync_now_;
                                   },
                                   this),
                               wake);
      if (stop_) return;
      const absl::Time now = absl::Now();
      for (auto it = handed_.begin(); it != handed_.end();) Settle(it++, now, actions);
      sync = now >= next_sync || sync_now_;
      sync_now_ = false;
    }
    if (sync) {
      next_sync = absl::Now() + absl::Milliseconds(times_.sync_interval_ms());
      for (size_t p = 0; p < peers_.size(); ++p) SyncPeer(p, actions);
    }
    Run(std::move(actions));
  }
}

absl::StatusOr<PeerForwarder::PeerStream> PeerForwarder::AskPeer(Peer& peer,
                                                                 const std::string& stream) {
  grpc::ClientContext context;
  PeerCall(context, admin_token_,
           std::chrono::milliseconds(std::max<uint32_t>(times_.sync_interval_ms(), 2000)));
  v1::IngestStatusRequest request;
  request.set_stream(stream);
  v1::IngestStatusReply reply;
  PF_RETURN_IF_ERROR(proto::FromGrpc(peer.stub->IngestStatus(&context, request, &reply),
                                     absl::StrCat("ingest status of peer ", peer.address)));
  PeerStream out;
  // A peer with no consumer job of the stream needs none of its steps.
  out.consumed_before = std::numeric_limits<int64_t>::max();
  for (const v1::IngestConsumerStats& consumer : reply.stream().consumers()) {
    out.consumed_before = std::min(out.consumed_before, consumer.consumed_before());
  }
  for (const v1::IngestStepStats& step : reply.stream().steps()) {
    if (step.sealed()) out.sealed.push_back(step.step());
  }
  std::sort(out.sealed.begin(), out.sealed.end());
  return out;
}

void PeerForwarder::SyncPeer(size_t p, Actions& actions) {
  Peer& peer = peers_[p];
  std::vector<std::string> streams;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [key, handed] : handed_) {
      if (handed.peers[p] != PeerHas::kConsumed &&
          (streams.empty() || streams.back() != key.first)) {
        streams.push_back(key.first);
      }
    }
  }
  for (const std::string& name : streams) {
    absl::StatusOr<PeerStream> seen = AskPeer(peer, name);
    if (!seen.ok()) {
      if (peer.reachable) {
        spdlog::warn(
            "ingest: peer {} does not answer ({}); the steps it has not consumed are "
            "kept here for it",
            peer.address, std::string(seen.status().message()));
      }
      peer.reachable = false;
      return;
    }
    if (!peer.reachable) spdlog::info("ingest: peer {} answers again", peer.address);
    peer.reachable = true;
    absl::MutexLock lock(&mutex_);
    const absl::Time now = absl::Now();
    for (auto it = handed_.lower_bound({name, std::numeric_limits<int64_t>::min()});
         it != handed_.end() && it->first.first == name;) {
      const int64_t step = it->first.second;
      PeerHas& has = it->second.peers[p];
      const bool holds = std::binary_search(seen->sealed.begin(), seen->sealed.end(), step);
      if (has != PeerHas::kConsumed && step < seen->consumed_before) {
        has = PeerHas::kConsumed;
      } else if (has == PeerHas::kStep && !holds) {
        spdlog::warn(
            "ingest stream {}: peer {} no longer holds step {} (it restarted?); "
            "forwarding it again",
            name, peer.address, step);
        has = PeerHas::kForwarding;
        actions.forwards.emplace_back(p, it->second.request);
      } else if (has == PeerHas::kNothing) {
        has = holds ? PeerHas::kStep : PeerHas::kForwarding;
        if (!holds) actions.forwards.emplace_back(p, it->second.request);
      }
      Settle(it++, now, actions);
    }
  }
}

}  // namespace packfeed::server
