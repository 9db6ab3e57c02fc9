#include "server/ingest/ingest_server.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/memory_region.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

// A get that has not completed by then fails the forward (and the origin's
// endpoint): the origin stopped progressing or died.
constexpr absl::Duration kTransferTimeout = absl::Seconds(30);
// Arenas one producer process may hold at once: each maps its memfd here.
constexpr int kArenasPerProcess = 16;
// How often the transfer thread looks for producers that exited.
constexpr absl::Duration kExitedProducerCheck = absl::Seconds(1);

bool SameProcess(const transport::PeerIdentity& a, const transport::PeerIdentity& b) {
  return a.pid == b.pid && a.uid == b.uid;
}

bool Exited(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

uint64_t SampleBytes(const PutSample& sample) {
  uint64_t bytes = sample.tokens * sizeof(int64_t);
  for (uint64_t field : sample.field_bytes) bytes += field;
  return bytes;
}

// Where a sample's fields lie in the buffer it is kept in (by stream field)
// and that buffer's size. A producer (or an origin daemon) that laid the
// sample out as one span, its tokens first and its fields after them with
// at most alignment padding between, is mirrored: one get reads it all.
// Otherwise the tokens and then the fields in stream order, one get each.
struct SampleLayout {
  std::vector<uint64_t> field_offsets;
  uint64_t bytes = 0;
  bool one_span = false;
};

SampleLayout LayoutOf(const PutSample& sample, const std::vector<int>& stream_field) {
  constexpr uint64_t kMostPaddingPerField = 8;
  SampleLayout layout;
  layout.field_offsets.assign(stream_field.size(), 0);
  const uint64_t tokens_end = sample.offset + sample.tokens * sizeof(int64_t);
  uint64_t span_end = tokens_end;
  bool after_tokens = true;
  for (size_t f = 0; f < sample.field_bytes.size(); ++f) {
    after_tokens = after_tokens && sample.field_offsets[f] >= tokens_end;
    span_end = std::max(span_end, sample.field_offsets[f] + sample.field_bytes[f]);
  }
  const uint64_t span = span_end - sample.offset;
  layout.one_span =
      after_tokens && span <= SampleBytes(sample) + kMostPaddingPerField * stream_field.size();
  if (layout.one_span) {
    for (size_t f = 0; f < sample.field_bytes.size(); ++f) {
      layout.field_offsets[static_cast<size_t>(stream_field[f])] =
          sample.field_offsets[f] - sample.offset;
    }
    layout.bytes = span;
    return layout;
  }
  std::vector<uint64_t> sizes(stream_field.size(), 0);  // by stream field
  for (size_t f = 0; f < sample.field_bytes.size(); ++f) {
    sizes[static_cast<size_t>(stream_field[f])] = sample.field_bytes[f];
  }
  uint64_t at = sample.tokens * sizeof(int64_t);
  for (size_t f = 0; f < sizes.size(); ++f) {
    layout.field_offsets[f] = at;
    at += sizes[f];
  }
  layout.bytes = at;
  return layout;
}

// Each sample's buffer starts aligned for its int64 tokens (and any field).
uint64_t AlignedToSample(uint64_t bytes) { return (bytes + 15) & ~uint64_t{15}; }

// The put's fields by their index in the stream.
std::vector<int> StreamFieldsOf(const IngestPut& put, const IngestStream& stream) {
  std::vector<int> stream_field;
  for (const std::string& name : put.fields) stream_field.push_back(stream.FieldIndex(name));
  return stream_field;
}

// The memory the samples of a forwarded `put` that are kept (`wanted`)
// take as Transfer allocates them, padding included: what the budget
// counts.
uint64_t HeldBytes(const IngestPut& put, const IngestStream& stream,
                   const std::vector<bool>& wanted) {
  const std::vector<int> stream_field = StreamFieldsOf(put, stream);
  uint64_t total = 0;
  for (size_t i = 0; i < put.samples.size(); ++i) {
    if (wanted[i]) {
      total += AlignedToSample(LayoutOf(put.samples[i], stream_field).bytes);
    }
  }
  return total;
}

// The most free spans a reply names: the producer places a put in the
// lowest that holds it, and the reply stays small however fragmented the
// arena.
constexpr size_t kFreeSpansNamed = 64;

// The reply to a put into `arena`, naming the spans free there now.
PutHeld PutHeldOf(const PutOutcome& outcome, const StagingArena& arena) {
  PutHeld reply;
  reply.samples_held = outcome.samples_held;
  reply.bytes_held = outcome.bytes_held;
  for (const auto& [offset, length] : arena.FreeSpans(kFreeSpansNamed)) {
    reply.free_spans.push_back({offset, length});
  }
  return reply;
}

absl::Status InForward(const ForwardedStep& forward, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("forwarded step ", forward.step, " of stream ",
                                                  forward.stream, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<IngestServer>> IngestServer::Start(
    std::vector<IngestStream*> streams, transport::UcxOptions ucx, bool for_peers) {
  // This worker talks only to peer daemons, on other nodes. Shared memory
  // is no way there; where two daemons share a host in separate network
  // namespaces it is reachable but its wake-ups (abstract Unix sockets) do
  // not cross them, and an idle worker never sees a peer's first message.
  if (ucx.transports.empty()) ucx.transports = "^sysv,posix";
  PF_ASSIGN_OR_RETURN(transport::UcpContext context, transport::UcpContext::Create(ucx));
  auto shared = std::make_shared<const transport::UcpContext>(std::move(context));
  PF_ASSIGN_OR_RETURN(transport::UcpWorker worker, transport::UcpWorker::Create(*shared));
  std::unique_ptr<IngestServer> server(
      new IngestServer(std::move(streams), std::move(shared), std::move(worker), for_peers));
  for (IngestStream* stream : server->streams_) {
    stream->SetOnFree([s = server.get()] { s->worker_.Signal(); });
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

IngestServer::IngestServer(std::vector<IngestStream*> streams,
                           std::shared_ptr<const transport::UcpContext> context,
                           transport::UcpWorker worker, bool for_peers)
    : streams_(std::move(streams)),
      context_(std::move(context)),
      for_peers_(for_peers),
      worker_(std::move(worker)) {}

void IngestServer::Stop() {
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
  }
  worker_.Signal();
  if (thread_.joinable()) thread_.join();
  for (IngestStream* stream : streams_) stream->SetOnFree(nullptr);
}

IngestStream* IngestServer::stream(const std::string& name) const {
  for (IngestStream* stream : streams_) {
    if (stream->name() == name) return stream;
  }
  return nullptr;
}

absl::StatusOr<std::pair<IngestStream*, std::shared_ptr<StagingArena>>> IngestServer::CheckPut(
    const ArenaPut& request, const transport::PeerIdentity& caller,
    std::shared_ptr<transport::SharedRing> shared) {
  const IngestPut& put = request.put;
  IngestStream* target = stream(put.stream);
  if (target == nullptr) {
    return absl::NotFoundError(absl::StrCat("no ingest stream '", put.stream, "'"));
  }
  PF_ASSIGN_OR_RETURN(std::shared_ptr<StagingArena> arena,
                      ArenaFor(request, caller, std::move(shared)));
  PF_RETURN_IF_ERROR(target->CheckPut(put).status());
  const uint64_t bytes = put.region.length;
  if (bytes > arena->bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a put of ", bytes, " bytes into a staging arena of ", arena->bytes()));
  }
  return std::make_pair(target, std::move(arena));
}

void IngestServer::Reserve(ArenaPut request, const transport::PeerIdentity& caller,
                           std::shared_ptr<transport::SharedRing> shared,
                           std::function<void(absl::StatusOr<Reservation>)> done) {
  absl::StatusOr<std::pair<IngestStream*, std::shared_ptr<StagingArena>>> checked =
      CheckPut(request, caller, std::move(shared));
  if (!checked.ok()) {
    spdlog::warn("ingest: put refused: {}", std::string(checked.status().message()));
    done(checked.status());
    return;
  }
  IngestStream* target = checked->first;
  const std::shared_ptr<StagingArena>& arena = checked->second;
  auto put = std::make_shared<const IngestPut>(std::move(request.put));
  const uint64_t bytes = put->region.length;
  auto span = std::make_shared<std::shared_ptr<ArenaSpan>>();
  auto claim = [memory = arena, bytes, span] {
    *span = memory->Take(bytes);
    return *span != nullptr;
  };
  auto run = [this, put, target, bytes, span, id = arena->id(), done](absl::Status room) {
    absl::StatusOr<Reservation> reply = absl::UnknownError("not run");
    if (!room.ok()) {
      reply = room;
    } else {
      absl::StatusOr<std::vector<IngestedSample>> samples = SamplesIn(*put, *target, *span);
      std::optional<Lease> cancelled;
      if (samples.ok()) {
        absl::MutexLock lock(&mutex_);
        auto it = arenas_.find(id);
        if (it != arenas_.end()) {
          cancelled = std::move(it->second.lease);
          it->second.lease = Lease{next_lease_++, target, put->step, bytes, *std::move(samples)};
          reply = Reservation{id, it->second.lease->id, (*span)->offset};
        } else {
          reply = absl::UnavailableError(absl::StrCat(
              "staging arena ", id, " was released (its producer exited) while the put waited"));
        }
      } else {
        reply = samples.status();
      }
      if (!reply.ok()) target->Unreserve(bytes);
      Cancel(cancelled);
    }
    if (!reply.ok()) spdlog::warn("ingest: put refused: {}", std::string(reply.status().message()));
    done(std::move(reply));
  };
  // Registering a span for peers is UCX work, kept to the transfer thread.
  const uint32_t timeout_ms = put->timeout_ms;
  Enqueue({target, bytes, timeout_ms, {}, false, std::move(claim), std::move(run)},
          /*may_run_here=*/!for_peers_);
}

void IngestServer::Put(ArenaPut request, const transport::PeerIdentity& caller,
                       std::function<void(absl::StatusOr<PutHeld>)> done) {
  absl::StatusOr<std::pair<IngestStream*, std::shared_ptr<StagingArena>>> checked =
      request.arena_token.empty()
          ? CheckPut(request, caller, nullptr)
          : absl::InvalidArgumentError("a put in one call names its arena, not an arena token");
  const uint64_t offset = request.written_at;
  const uint64_t bytes = request.put.region.length;
  if (checked.ok()) {
    // ABORTED, as a failed sequencer check: the producer puts again
    // through Reserve and Commit, telling this from any other refusal by
    // its code.
    if (!checked->second->IsFree(offset, bytes)) {
      checked = absl::AbortedError(absl::StrCat(
          "the put's span [", offset, ", ", offset + bytes, ") of staging arena ", request.arena,
          " is not free: a put in one call goes within a free span a reply named"));
    }
  }
  if (!checked.ok()) {
    spdlog::warn("ingest: put refused: {}", std::string(checked.status().message()));
    done(checked.status());
    return;
  }
  // Only this producer's puts take spans of its arena, one at a time, so
  // the span stays free while the put waits for room in its stream.
  IngestStream* target = checked->first;
  auto span = std::make_shared<std::shared_ptr<ArenaSpan>>();
  auto claim = [memory = checked->second, offset, bytes, span] {
    *span = memory->TakeAt(offset, bytes);
    return *span != nullptr;
  };
  auto put = std::make_shared<const IngestPut>(std::move(request.put));
  auto run = [this, put, target, bytes, span, done](absl::Status room) {
    absl::StatusOr<PutHeld> reply = absl::UnknownError("not run");
    if (!room.ok()) {
      reply = room;
    } else {
      absl::StatusOr<std::vector<IngestedSample>> samples = SamplesIn(*put, *target, *span);
      if (!samples.ok()) {
        target->Unreserve(bytes);
        reply = samples.status();
      } else {
        absl::StatusOr<PutOutcome> outcome = target->Commit(put->step, *std::move(samples), bytes);
        if (outcome.ok()) {
          target->CountPutInOneCall();
          reply = PutHeldOf(*outcome, *(*span)->arena);
        } else {
          reply = outcome.status();
        }
      }
      span->reset();  // a refused put's span is free again before the answer
    }
    if (!reply.ok()) spdlog::warn("ingest: put refused: {}", std::string(reply.status().message()));
    done(std::move(reply));
  };
  const uint32_t timeout_ms = put->timeout_ms;
  Enqueue({target, bytes, timeout_ms, {}, false, std::move(claim), std::move(run)},
          /*may_run_here=*/!for_peers_);
}

absl::StatusOr<std::shared_ptr<StagingArena>> IngestServer::ArenaFor(
    const ArenaPut& request, const transport::PeerIdentity& caller,
    std::shared_ptr<transport::SharedRing> shared) {
  std::optional<Lease> cancelled;
  absl::StatusOr<std::shared_ptr<StagingArena>> found;
  {
    absl::MutexLock lock(&mutex_);
    if (shared != nullptr) {
      const auto of_caller = std::count_if(arenas_.begin(), arenas_.end(), [&](const auto& entry) {
        return SameProcess(entry.second.memory->owner(), caller);
      });
      if (of_caller >= kArenasPerProcess) {
        return absl::ResourceExhaustedError(
            absl::StrCat("pid ", caller.pid, " holds ", of_caller, " staging arenas, the most one ",
                         "process may (a producer releases its own when destroyed)"));
      }
      const uint64_t id = next_arena_++;
      auto memory = std::make_shared<StagingArena>(id, std::move(shared), caller);
      arenas_[id].memory = memory;
      return memory;
    }
    auto it = arenas_.find(request.arena);
    if (it == arenas_.end()) {
      return absl::NotFoundError(absl::StrCat("no staging arena ", request.arena,
                                              " (released, or never shared): share it again"));
    }
    if (!SameProcess(it->second.memory->owner(), caller)) {
      return absl::PermissionDeniedError(
          absl::StrCat("staging arena ", request.arena, " is not pid ", caller.pid, "'s"));
    }
    // A producer puts one at a time: a reservation still held is of a put
    // it gave up on.
    cancelled = std::move(it->second.lease);
    it->second.lease.reset();
    found = it->second.memory;
  }
  Cancel(cancelled);
  return found;
}

absl::StatusOr<std::vector<IngestedSample>> IngestServer::SamplesIn(
    const IngestPut& put, const IngestStream& stream, const std::shared_ptr<ArenaSpan>& span) {
  if (for_peers_) {
    PF_ASSIGN_OR_RETURN(transport::MemoryRegion memory,
                        transport::MemoryRegion::Register(context_->get(), span->data(),
                                                          span->bytes, UCS_MEMORY_TYPE_HOST));
    auto described = std::make_shared<SampleRegion>();
    PF_ASSIGN_OR_RETURN(described->remote_key, memory.PackRemoteKey());
    described->worker_address = worker_.address();
    described->address = reinterpret_cast<uint64_t>(memory.address());
    described->length = memory.length();
    span->context = context_;
    span->registered.emplace(std::move(memory));
    span->region = std::move(described);
  }
  const std::vector<int> stream_field = StreamFieldsOf(put, stream);
  std::vector<IngestedSample> samples(put.samples.size());
  for (size_t i = 0; i < put.samples.size(); ++i) {
    const PutSample& in = put.samples[i];
    SampleLayout layout = LayoutOf(in, stream_field);
    if (!layout.one_span || in.offset % alignof(int64_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ingest stream ", put.stream, " step ", put.step, " sample ", i,
          ": its tokens must start 8-byte aligned with its fields after them in one span"));
    }
    IngestedSample& out = samples[i];
    out.group = in.group;
    out.tag = in.tag;
    out.num_tokens = static_cast<int64_t>(in.tokens);
    out.field_offsets = std::move(layout.field_offsets);
    out.data_bytes = layout.bytes;
    out.data = std::shared_ptr<const char[]>(span, span->data() + in.offset);
    out.region = span->region;
  }
  return samples;
}

void IngestServer::Cancel(std::optional<Lease>& lease) {
  if (!lease.has_value()) return;
  lease->samples.clear();  // the span is free again
  lease->stream->Unreserve(lease->bytes);
  lease.reset();
}

absl::StatusOr<PutHeld> IngestServer::Commit(const LeaseCommit& request,
                                             const transport::PeerIdentity& caller) {
  std::optional<Lease> lease;
  std::shared_ptr<StagingArena> arena;
  {
    absl::MutexLock lock(&mutex_);
    auto it = arenas_.find(request.arena);
    if (it == arenas_.end()) {
      return absl::NotFoundError(absl::StrCat("no staging arena ", request.arena));
    }
    if (!SameProcess(it->second.memory->owner(), caller)) {
      return absl::PermissionDeniedError(
          absl::StrCat("staging arena ", request.arena, " is not pid ", caller.pid, "'s"));
    }
    std::optional<Lease>& held = it->second.lease;
    if (!held.has_value() || held->id != request.lease || held->stream->name() != request.stream) {
      return absl::NotFoundError(absl::StrCat(
          "lease ", request.lease, " of staging arena ", request.arena, " in stream ",
          request.stream, " is not reserved (a later reserve cancelled it, or it was committed)"));
    }
    lease = std::move(held);
    held.reset();
    arena = it->second.memory;
  }
  PF_ASSIGN_OR_RETURN(PutOutcome outcome,
                      lease->stream->Commit(lease->step, std::move(lease->samples), lease->bytes));
  return PutHeldOf(outcome, *arena);
}

absl::Status IngestServer::ReleaseArena(uint64_t arena, const transport::PeerIdentity& caller) {
  std::optional<Lease> cancelled;
  {
    absl::MutexLock lock(&mutex_);
    auto it = arenas_.find(arena);
    if (it == arenas_.end()) return absl::NotFoundError(absl::StrCat("no staging arena ", arena));
    if (!SameProcess(it->second.memory->owner(), caller)) {
      return absl::PermissionDeniedError(
          absl::StrCat("staging arena ", arena, " is not pid ", caller.pid, "'s"));
    }
    cancelled = std::move(it->second.lease);
    arenas_.erase(it);
  }
  Cancel(cancelled);
  return absl::OkStatus();
}

void IngestServer::ForgetExitedProducers() {
  std::vector<std::optional<Lease>> cancelled;
  {
    absl::MutexLock lock(&mutex_);
    for (auto it = arenas_.begin(); it != arenas_.end();) {
      const transport::PeerIdentity& owner = it->second.memory->owner();
      if (!Exited(owner.pid)) {
        ++it;
        continue;
      }
      spdlog::info("ingest: the producer of staging arena {} (pid {}) exited{}", it->first,
                   owner.pid, it->second.lease.has_value() ? "; its reservation is cancelled" : "");
      cancelled.push_back(std::move(it->second.lease));
      it = arenas_.erase(it);
    }
  }
  for (std::optional<Lease>& lease : cancelled) Cancel(lease);
}

void IngestServer::Forward(ForwardedStep forwarded,
                           std::function<void(absl::StatusOr<ForwardFetched>)> done) {
  auto shared = std::make_shared<const ForwardedStep>(std::move(forwarded));
  const ForwardedStep& forward = *shared;
  IngestStream* target = stream(forward.stream);
  if (target == nullptr) {
    done(absl::NotFoundError(absl::StrCat("no ingest stream '", forward.stream, "'")));
    return;
  }
  ForwardFetched reply;
  if (target->SealedOrConsumed(forward.step)) {
    // A restarted origin's driver put it again: the plan is the same.
    spdlog::info("ingest stream {}: forwarded step {} is here already", forward.stream,
                 forward.step);
    reply.held_already = true;
    done(reply);
    return;
  }
  // The step as sealed, lengths only, to plan which samples to fetch.
  auto step = std::make_shared<SealedStep>();
  step->step = forward.step;
  for (const IngestPut& put : forward.puts) {
    absl::Status valid = put.step == forward.step
                             ? target->CheckPut(put).status()
                             : absl::InvalidArgumentError("a put of another step");
    if (!valid.ok()) {
      done(InForward(forward, valid));
      return;
    }
    for (const PutSample& sample : put.samples) {
      IngestedSample& lengths_only = step->samples.emplace_back();
      lengths_only.group = sample.group;
      lengths_only.tag = sample.tag;
      lengths_only.num_tokens = static_cast<int64_t>(sample.tokens);
    }
  }
  absl::StatusOr<std::vector<bool>> local = target->LocalSamples(step);
  if (!local.ok()) {
    done(InForward(forward, local.status()));
    return;
  }
  // Per put, the samples to fetch; and their bytes.
  auto wanted = std::make_shared<std::vector<std::vector<bool>>>();
  uint64_t bytes = 0;
  size_t next = 0;
  for (const IngestPut& put : forward.puts) {
    std::vector<bool>& of_put = wanted->emplace_back();
    for (size_t i = 0; i < put.samples.size(); ++i, ++next) of_put.push_back((*local)[next]);
    bytes += HeldBytes(put, *target, of_put);
  }
  reply.samples = step->samples.size();
  reply.samples_fetched = static_cast<uint64_t>(std::count(local->begin(), local->end(), true));
  reply.bytes_fetched = bytes;
  auto run = [this, shared, target, bytes, wanted, reply, done](absl::Status room) {
    const ForwardedStep& forward = *shared;
    absl::StatusOr<ForwardFetched> result = reply;
    if (!room.ok()) result = room;
    std::vector<IngestedSample> samples;
    for (size_t p = 0; room.ok() && p < wanted->size(); ++p) {
      absl::StatusOr<std::vector<IngestedSample>> of_put =
          Transfer(forward.puts[p], *target, (*wanted)[p]);
      if (!of_put.ok()) {
        result = of_put.status();
        break;
      }
      for (IngestedSample& sample : *of_put) samples.push_back(std::move(sample));
    }
    if (room.ok() && !result.ok()) target->Unreserve(bytes);
    if (result.ok()) {
      absl::StatusOr<PutOutcome> committed =
          target->Commit(forward.step, std::move(samples), bytes);
      absl::Status sealed =
          committed.ok() ? target->Seal(forward.step).status() : committed.status();
      result = sealed.ok() ? absl::StatusOr<ForwardFetched>(reply) : sealed;
    }
    if (!result.ok()) {
      result = InForward(forward, result.status());
      spdlog::warn("ingest: {}", std::string(result.status().message()));
    } else {
      spdlog::info("ingest stream {}: forwarded step {} sealed, {} of its {} samples fetched",
                   forward.stream, forward.step, reply.samples_fetched, reply.samples);
    }
    done(std::move(result));
  };
  const uint32_t timeout_ms = forward.puts.empty() ? 0 : forward.puts[0].timeout_ms;
  Enqueue({target, bytes, timeout_ms, {}, false, nullptr, std::move(run)}, false);
}

void IngestServer::Enqueue(PendingPut pending, bool may_run_here) {
  pending.deadline = absl::Now() + absl::Milliseconds(pending.timeout_ms);
  bool admitted = false;
  {
    absl::MutexLock lock(&mutex_);
    if (stop_) {
      pending.run(absl::UnavailableError("the daemon is stopping"));
      return;
    }
    // With nothing of its stream waiting before it and room now, a put is
    // admitted on the caller's thread, sparing a wake-up of the transfer
    // thread (a second runnable thread on a busy node) per put.
    if (may_run_here && queued_[pending.stream] == 0 &&
        pending.stream->Reserve(pending.bytes).ok()) {
      admitted = pending.claim == nullptr || pending.claim();
      if (!admitted) pending.stream->Unreserve(pending.bytes);
    }
    if (!admitted) {
      ++queued_[pending.stream];
      arrived_.push_back(std::move(pending));
    }
  }
  if (admitted) {
    pending.run(absl::OkStatus());
  } else {
    worker_.Signal();
  }
}

void IngestServer::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mutex_);
      if (stop_) break;
      while (!arrived_.empty()) {
        pending_.push_back(std::move(arrived_.front()));
        arrived_.pop_front();
      }
    }
    ServePending();
    if (absl::Now() - arenas_checked_ >= kExitedProducerCheck) {
      ForgetExitedProducers();
      arenas_checked_ = absl::Now();
    }
    // Woken by a new put and by freed bytes; the short timeout while puts
    // wait is for their deadlines.
    worker_.ProgressOrWait(pending_.empty() ? absl::Seconds(1) : absl::Milliseconds(10));
  }
  std::vector<std::optional<Lease>> cancelled;
  {
    absl::MutexLock lock(&mutex_);
    for (auto* queue : {&pending_, &arrived_}) {
      for (PendingPut& put : *queue) put.run(absl::UnavailableError("the daemon is stopping"));
      queue->clear();
    }
    for (auto& [id, arena] : arenas_) cancelled.push_back(std::move(arena.lease));
    arenas_.clear();
  }
  for (std::optional<Lease>& lease : cancelled) Cancel(lease);
}

void IngestServer::ServePending() {
  std::set<const IngestStream*> full;  // later puts wait behind an earlier one
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingPut& pending = *it;
    if (full.count(pending.stream) != 0) {
      ++it;
      continue;
    }
    absl::Status room = pending.stream->Reserve(pending.bytes);
    if (room.ok() && pending.claim != nullptr && !pending.claim()) {
      pending.stream->Unreserve(pending.bytes);
      room = absl::UnavailableError(
          absl::StrCat("the producer's staging arena has no free span of ", pending.bytes,
                       " bytes (the stream has room: it is fragmented)"));
    }
    if (absl::IsUnavailable(room) && absl::Now() < pending.deadline) {
      if (!pending.waited) pending.stream->CountWait();
      pending.waited = true;
      full.insert(pending.stream);
      ++it;
      continue;
    }
    if (!room.ok()) {
      pending.stream->CountRefusal();
      room = absl::ResourceExhaustedError(
          absl::StrCat(room.message(), pending.timeout_ms > 0
                                           ? absl::StrCat("; waited ", pending.timeout_ms, " ms")
                                           : std::string("; the put had no timeout to wait")));
    }
    pending.run(std::move(room));
    {
      absl::MutexLock lock(&mutex_);
      --queued_[pending.stream];
    }
    it = pending_.erase(it);
  }
}

absl::StatusOr<std::vector<IngestedSample>> IngestServer::Transfer(
    const IngestPut& put, const IngestStream& stream, const std::vector<bool>& wanted) {
  const PutRegion& source = put.region;
  const std::vector<int> stream_field = StreamFieldsOf(put, stream);
  // Every wanted sample in one allocation, each at an aligned start.
  std::vector<SampleLayout> layouts(put.samples.size());
  uint64_t total = 0;
  for (size_t i = 0; i < put.samples.size(); ++i) {
    if (!wanted[i]) continue;
    layouts[i] = LayoutOf(put.samples[i], stream_field);
    total += AlignedToSample(layouts[i].bytes);
  }
  std::shared_ptr<char[]> memory =
      std::make_shared_for_overwrite<char[]>(std::max<uint64_t>(total, 1));
  std::vector<IngestedSample> samples(put.samples.size());
  std::vector<transport::RemoteReader::Read> reads;  // (into, bytes, at the origin)
  uint64_t next = 0;                                 // in `memory`
  for (size_t i = 0; i < put.samples.size(); ++i) {
    const PutSample& in = put.samples[i];
    IngestedSample& out = samples[i];
    out.group = in.group;
    out.tag = in.tag;
    out.num_tokens = static_cast<int64_t>(in.tokens);
    if (!wanted[i]) continue;
    SampleLayout& layout = layouts[i];
    // Not zero-filled: the gets overwrite every byte served (CheckPut
    // checked each field's size).
    char* buffer = memory.get() + next;
    if (layout.one_span) {
      reads.push_back({buffer, layout.bytes, in.offset});
    } else {
      reads.push_back({buffer, in.tokens * sizeof(int64_t), in.offset});
      for (size_t f = 0; f < in.field_bytes.size(); ++f) {
        reads.push_back({buffer + layout.field_offsets[static_cast<size_t>(stream_field[f])],
                         in.field_bytes[f], in.field_offsets[f]});
      }
    }
    out.field_offsets = std::move(layout.field_offsets);
    out.data_bytes = layout.bytes;
    out.data = std::shared_ptr<const char[]>(memory, buffer);
    next += AlignedToSample(layout.bytes);
  }
  const absl::Status status =
      reader_.ReadAll(source.worker_address, source.remote_key, source.address, reads,
                      absl::Now() + kTransferTimeout);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("ingest stream ", put.stream, " step ", put.step,
                                               ": reading the forwarded bytes from the origin "
                                               "failed: ",
                                               status.message()));
  }
  return samples;
}

}  // namespace packfeed::server
