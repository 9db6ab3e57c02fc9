#include "packfeed/client/producer.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/src/grpc_status.h"
#include "client/src/share_ring.h"
#include "grpcpp/create_channel.h"
#include "packfeed/common/copy_past_caches.h"
#include "packfeed/common/mutex_mode.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/shared_ring.h"
#include "packfeed/v1/service.grpc.pb.h"

namespace packfeed::client {
namespace {

// A sample starts 16-byte aligned (its int64 tokens, and any field's rows,
// read in place by the daemon); its fields follow its tokens 8-byte aligned.
uint64_t SampleAligned(uint64_t offset) { return (offset + 15) & ~uint64_t{15}; }
uint64_t FieldAligned(uint64_t offset) { return (offset + 7) & ~uint64_t{7}; }
// The daemon gives out arena spans at multiples of 64 bytes, lengths
// rounded up to 64 (ArenaFreeSpan).
uint64_t SpanAligned(uint64_t bytes) { return (bytes + 63) & ~uint64_t{63}; }

// The staging arena of a stream with a budget: twice the budget, so that a
// put finds a free span although the stream's held bytes lie scattered. A
// memfd takes memory only where written, and freed spans are written again.
uint64_t ArenaBytes(uint64_t budget_bytes) {
  if (budget_bytes > 0) return 2 * budget_bytes;
  // An unbounded stream: half this machine's memory.
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 2;
}

}  // namespace

// The producer's gRPC stub and its staging arena, shared with the daemon.
class Producer::Impl {
 public:
  explicit Impl(ProducerOptions options) : options_(std::move(options)) {
    channel_ =
        grpc::CreateChannel("unix:" + options_.socket_path, grpc::InsecureChannelCredentials());
    ingest_ = v1::Ingest::NewStub(channel_);
  }
  ~Impl();

  absl::StatusOr<PutResult> Put(int64_t step, absl::Span<const std::string> fields,
                                absl::Span<const ProducerSample> samples, absl::Duration wait);
  absl::StatusOr<SealResult> Seal(int64_t step);
  absl::StatusOr<IngestStreamStatus> Status();
  uint64_t arena_bytes() const;
  uint64_t arena_bytes_written() const;

 private:
  // Where to write the put `request` describes: a span of the arena,
  // reserved once the stream has room. Shares the arena with the daemon
  // first when it does not know it (the first put; after a restart).
  absl::StatusOr<v1::ReserveReply> Reserve(v1::ReserveRequest& request, absl::Duration wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status ShareArena(v1::ReserveRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The put in two calls: Reserve, the copy, Commit.
  absl::StatusOr<v1::PutReply> PutInTwoCalls(v1::ReserveRequest& request,
                                             absl::Span<const ProducerSample> samples,
                                             absl::Duration wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The put in one call (Ingest.Put), its samples written at `offset`.
  absl::StatusOr<v1::PutReply> PutInOneCall(v1::ReserveRequest& request, uint64_t offset,
                                            absl::Duration wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The one copy of the samples' bytes, into the arena at `offset` where
  // the daemon serves them from. The daemon's packers read them later,
  // not this thread, so the copy goes past the caches.
  void WriteSamples(const v1::PutRequest& request, absl::Span<const ProducerSample> samples,
                    uint64_t offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The lowest span of `bytes` within the free spans the daemon last
  // named, now taken from them; nullopt when none is that long within the
  // part of the arena puts have written.
  std::optional<uint64_t> PlaceInFreeSpan(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const ProducerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ingest::Stub> ingest_;
  mutable absl::Mutex mutex_;  // puts are serialised: one reservation at a time
  std::optional<transport::SharedRing> arena_ ABSL_GUARDED_BY(mutex_);
  uint64_t arena_id_ ABSL_GUARDED_BY(mutex_) = 0;  // 0 = not known to the daemon
  uint64_t arena_written_ ABSL_GUARDED_BY(mutex_) = 0;
  // offset -> length: the arena's free spans in the daemon's last answer,
  // less what puts placed since. The daemon only frees spans between two
  // puts, so these are free at least.
  std::map<uint64_t, uint64_t> free_spans_ ABSL_GUARDED_BY(mutex_);
};

absl::StatusOr<std::unique_ptr<Producer>> Producer::Create(const ProducerOptions& options) {
  UseReleaseMutexChecks();
  if (options.stream.empty())
    return absl::InvalidArgumentError("ProducerOptions.stream is required");
  PF_RETURN_IF_ERROR(CheckUnixSocketPath(options.socket_path));
  return std::unique_ptr<Producer>(new Producer(std::make_unique<Impl>(options)));
}

Producer::Producer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Producer::~Producer() = default;
absl::StatusOr<PutResult> Producer::Put(int64_t step, absl::Span<const std::string> fields,
                                        absl::Span<const ProducerSample> samples,
                                        absl::Duration wait) {
  return impl_->Put(step, fields, samples, wait);
}
absl::StatusOr<SealResult> Producer::Seal(int64_t step) { return impl_->Seal(step); }
absl::StatusOr<IngestStreamStatus> Producer::Status() { return impl_->Status(); }
uint64_t Producer::arena_bytes() const { return impl_->arena_bytes(); }
uint64_t Producer::arena_bytes_written() const { return impl_->arena_bytes_written(); }

Producer::Impl::~Impl() {
  absl::MutexLock lock(&mutex_);
  if (arena_id_ == 0) return;
  // The daemon notices an exited producer by itself; a producer destroyed
  // in a process that goes on says so, and its arena is unmapped there now.
  v1::ReleaseArenaRequest request;
  request.set_stream(options_.stream);
  request.set_auth_token(options_.auth_token);
  request.set_arena(arena_id_);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  v1::ReleaseArenaReply reply;
  (void)ingest_->ReleaseArena(&context, request, &reply);
}

uint64_t Producer::Impl::arena_bytes() const {
  absl::MutexLock lock(&mutex_);
  return arena_.has_value() ? arena_->bytes() : 0;
}

uint64_t Producer::Impl::arena_bytes_written() const {
  absl::MutexLock lock(&mutex_);
  return arena_written_;
}

absl::Status Producer::Impl::ShareArena(v1::ReserveRequest& request) {
  if (!arena_.has_value()) {
    PF_ASSIGN_OR_RETURN(const IngestStreamStatus stream, Status());
    PF_ASSIGN_OR_RETURN(transport::SharedRing arena,
                        transport::SharedRing::Create(ArenaBytes(stream.budget_bytes)));
    arena_.emplace(std::move(arena));
  }
  PF_ASSIGN_OR_RETURN(std::string token,
                      ShareRing(options_.socket_path + ".rings", arena_->fd(),
                                transport::RingOffer{arena_->bytes(), ""}, options_.call_timeout));
  request.set_arena_token(std::move(token));
  request.clear_arena();
  return absl::OkStatus();
}

absl::StatusOr<v1::ReserveReply> Producer::Impl::Reserve(v1::ReserveRequest& request,
                                                         absl::Duration wait) {
  const std::string what = absl::StrCat("put into step ", request.put().step());
  for (int attempt = 0;; ++attempt) {
    if (arena_id_ == 0) {
      PF_RETURN_IF_ERROR(ShareArena(request));
    } else {
      request.set_arena(arena_id_);
      request.clear_arena_token();
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + wait + options_.call_timeout));
    v1::ReserveReply reply;
    absl::Status status =
        DaemonCallStatus(ingest_->Reserve(&context, request, &reply), what, options_.socket_path);
    // A daemon restarted since the arena was shared knows it no more (a
    // stream it does not know either is refused again, with its name).
    if (absl::IsNotFound(status) && arena_id_ != 0 && attempt == 0) {
      arena_id_ = 0;
      continue;
    }
    PF_RETURN_IF_ERROR(status);
    arena_id_ = reply.arena();
    return reply;
  }
}

absl::StatusOr<PutResult> Producer::Impl::Put(int64_t step, absl::Span<const std::string> fields,
                                              absl::Span<const ProducerSample> samples,
                                              absl::Duration wait) {
  absl::MutexLock lock(&mutex_);
  v1::ReserveRequest reserve;
  v1::PutRequest& request = *reserve.mutable_put();
  request.set_stream(options_.stream);
  request.set_auth_token(options_.auth_token);
  request.set_step(step);
  for (const std::string& name : fields) request.add_fields(name);
  request.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
  // Where each sample goes in the put's region, laid out from 0.
  uint64_t at = 0;
  for (const ProducerSample& sample : samples) {
    if (sample.fields.size() != fields.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a sample of group ", sample.group, " has ",
                                                     sample.fields.size(),
                                                     " fields; the put names ", fields.size()));
    }
    v1::IngestSample* out = request.add_samples();
    out->set_group(sample.group);
    out->set_tag(sample.tag);
    out->set_tokens(sample.tokens.size());
    at = SampleAligned(at);
    out->set_offset(at);
    at += sample.tokens.size() * sizeof(int64_t);
    for (absl::Span<const char> field : sample.fields) {
      at = FieldAligned(at);
      out->add_field_offsets(at);
      out->add_field_bytes(field.size());
      at += field.size();
    }
  }
  request.mutable_region()->set_length(SampleAligned(at));
  // Once the daemon has named free spans of the arena, a put is one call:
  // written into such a span first, then announced. A span the daemon no
  // longer has free, or an arena it lost in a restart, sends the put
  // through the two calls instead, which reserve afresh.
  absl::StatusOr<v1::PutReply> reply = absl::UnknownError("not put");
  std::optional<uint64_t> placed =
      arena_id_ != 0 ? PlaceInFreeSpan(request.region().length()) : std::nullopt;
  if (placed.has_value()) {
    WriteSamples(request, samples, *placed);
    reply = PutInOneCall(reserve, *placed, wait);
    // ABORTED: the span is not free; NOT_FOUND: the arena is not known
    // (a daemon restarted since), which the two calls share again.
    if (absl::IsAborted(reply.status()) || absl::IsNotFound(reply.status())) placed.reset();
  }
  if (!placed.has_value()) reply = PutInTwoCalls(reserve, samples, wait);
  free_spans_.clear();
  PF_RETURN_IF_ERROR(reply.status());
  for (const v1::ArenaFreeSpan& span : reply->free_spans()) {
    free_spans_[span.offset()] = span.length();
  }
  return PutResult{reply->samples_held(), reply->bytes_held()};
}

std::optional<uint64_t> Producer::Impl::PlaceInFreeSpan(uint64_t bytes) {
  const uint64_t need = SpanAligned(bytes);
  for (auto it = free_spans_.begin(); it != free_spans_.end(); ++it) {
    const auto [offset, length] = *it;
    if (length < need) continue;
    // Past what puts have written, the daemon places the put: spans freed
    // since its last answer may hold it in memory written before, where
    // the copy does not wait for the kernel to zero fresh pages.
    if (offset + need > arena_written_) return std::nullopt;
    free_spans_.erase(it);
    if (length > need) free_spans_[offset + need] = length - need;
    return offset;
  }
  return std::nullopt;
}

void Producer::Impl::WriteSamples(const v1::PutRequest& request,
                                  absl::Span<const ProducerSample> samples, uint64_t offset) {
  char* base = reinterpret_cast<char*>(arena_->data()) + offset;
  arena_written_ = std::max(arena_written_, offset + request.region().length());
  for (size_t i = 0; i < samples.size(); ++i) {
    const ProducerSample& sample = samples[i];
    const v1::IngestSample& placed = request.samples(static_cast<int>(i));
    if (!sample.tokens.empty()) {
      CopyPastCaches(base + placed.offset(), sample.tokens.data(),
                     sample.tokens.size() * sizeof(int64_t));
    }
    for (size_t f = 0; f < sample.fields.size(); ++f) {
      const absl::Span<const char> field = sample.fields[f];
      if (!field.empty()) {
        CopyPastCaches(base + placed.field_offsets(static_cast<int>(f)), field.data(),
                       field.size());
      }
    }
  }
  FenceCopiesPastCaches();
}

absl::StatusOr<v1::PutReply> Producer::Impl::PutInOneCall(v1::ReserveRequest& request,
                                                          uint64_t offset, absl::Duration wait) {
  request.set_arena(arena_id_);
  request.clear_arena_token();
  request.set_written_at(offset);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + wait + options_.call_timeout));
  v1::PutReply reply;
  PF_RETURN_IF_ERROR(DaemonCallStatus(ingest_->Put(&context, request, &reply),
                                      absl::StrCat("put into step ", request.put().step()),
                                      options_.socket_path));
  return reply;
}

absl::StatusOr<v1::PutReply> Producer::Impl::PutInTwoCalls(v1::ReserveRequest& request,
                                                           absl::Span<const ProducerSample> samples,
                                                           absl::Duration wait) {
  request.clear_written_at();
  PF_ASSIGN_OR_RETURN(const v1::ReserveReply reserved, Reserve(request, wait));
  WriteSamples(request.put(), samples, reserved.offset());
  v1::CommitRequest commit;
  commit.set_stream(options_.stream);
  commit.set_auth_token(options_.auth_token);
  commit.set_arena(reserved.arena());
  commit.set_lease(reserved.lease());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  v1::PutReply reply;
  PF_RETURN_IF_ERROR(DaemonCallStatus(ingest_->Commit(&context, commit, &reply),
                                      absl::StrCat("put into step ", request.put().step()),
                                      options_.socket_path));
  return reply;
}

absl::StatusOr<SealResult> Producer::Impl::Seal(int64_t step) {
  v1::SealRequest request;
  request.set_stream(options_.stream);
  request.set_auth_token(options_.auth_token);
  request.set_step(step);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  v1::SealReply reply;
  PF_RETURN_IF_ERROR(DaemonCallStatus(ingest_->Seal(&context, request, &reply),
                                      absl::StrCat("seal step ", step), options_.socket_path));
  return SealResult{
      reply.samples(), reply.groups(), {reply.peers_behind().begin(), reply.peers_behind().end()}};
}

absl::StatusOr<IngestStreamStatus> Producer::Impl::Status() {
  v1::IngestStatusRequest request;
  request.set_stream(options_.stream);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  v1::IngestStatusReply reply;
  PF_RETURN_IF_ERROR(DaemonCallStatus(ingest_->Status(&context, request, &reply), "ingest status",
                                      options_.socket_path));
  const v1::IngestStreamStats& stats = reply.stream();
  IngestStreamStatus out;
  out.name = stats.name();
  out.bytes_held = stats.bytes_held();
  out.peak_bytes_held = stats.peak_bytes_held();
  out.budget_bytes = stats.budget_bytes();
  out.samples_put = stats.samples_put();
  out.bytes_put = stats.bytes_put();
  out.puts_waited = stats.puts_waited();
  out.puts_in_one_call = stats.puts_in_one_call();
  out.puts_refused = stats.puts_refused();
  for (const v1::IngestStepStats& step : stats.steps()) {
    out.steps.push_back({step.step(),
                         step.sealed(),
                         step.samples(),
                         step.bytes(),
                         {step.consumed_by().begin(), step.consumed_by().end()}});
  }
  for (const v1::IngestConsumerStats& consumer : stats.consumers()) {
    out.consumers.push_back({consumer.job(), consumer.consumed_before(), consumer.bytes_pending()});
  }
  return out;
}

}  // namespace packfeed::client
