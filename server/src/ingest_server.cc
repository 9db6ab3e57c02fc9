#include "server/internal/ingest_server.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

// A get that has not completed by then fails the put (and the producer's
// endpoint): the producer stopped progressing or died.
constexpr absl::Duration kTransferTimeout = absl::Seconds(30);
void OnProducerError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  spdlog::warn("ingest: a producer's endpoint failed: {}", ucs_status_string(status));
  *static_cast<bool*>(arg) = true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<IngestServer>> IngestServer::Start(
    std::vector<IngestStream*> streams, const transport::UcxOptions& ucx) {
  PF_ASSIGN_OR_RETURN(transport::UcpContext context, transport::UcpContext::Create(ucx));
  PF_ASSIGN_OR_RETURN(transport::UcpWorker worker, transport::UcpWorker::Create(context));
  std::unique_ptr<IngestServer> server(
      new IngestServer(std::move(streams), std::move(context), std::move(worker)));
  for (IngestStream* stream : server->streams_) {
    stream->SetOnFree([s = server.get()] { s->worker_.Signal(); });
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

IngestServer::IngestServer(std::vector<IngestStream*> streams, transport::UcpContext context,
                           transport::UcpWorker worker)
    : streams_(std::move(streams)), context_(std::move(context)), worker_(std::move(worker)) {}

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

void IngestServer::Put(const v1::PutRequest& put,
                       std::function<void(absl::StatusOr<v1::PutReply>)> done) {
  IngestStream* target = stream(put.stream());
  if (target == nullptr) {
    done(absl::NotFoundError(absl::StrCat("no ingest stream '", put.stream(), "'")));
    return;
  }
  absl::StatusOr<uint64_t> bytes = target->CheckPut(put);
  if (!bytes.ok()) {
    spdlog::warn("ingest: put refused: {}", std::string(bytes.status().message()));
    done(bytes.status());
    return;
  }
  {
    absl::MutexLock lock(&mutex_);
    if (stop_) {
      done(absl::UnavailableError("the daemon is stopping"));
      return;
    }
    arrived_.push_back({&put, target, *bytes, absl::Now() + absl::Milliseconds(put.timeout_ms()),
                        false, std::move(done)});
  }
  worker_.Signal();
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
    // Woken by a new put and by freed bytes; the short timeout while puts
    // wait is for their deadlines.
    worker_.ProgressOrWait(pending_.empty() ? absl::Seconds(1) : absl::Milliseconds(10));
  }
  absl::MutexLock lock(&mutex_);
  for (auto* queue : {&pending_, &arrived_}) {
    for (PendingPut& put : *queue) put.done(absl::UnavailableError("the daemon is stopping"));
    queue->clear();
  }
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
    if (absl::IsUnavailable(room) && absl::Now() < pending.deadline) {
      if (!pending.waited) pending.stream->CountWait();
      pending.waited = true;
      full.insert(pending.stream);
      ++it;
      continue;
    }
    absl::StatusOr<v1::PutReply> reply;
    if (!room.ok()) {
      pending.stream->CountRefusal();
      reply = absl::ResourceExhaustedError(absl::StrCat(
          room.message(), pending.put->timeout_ms() > 0
                              ? absl::StrCat("; waited ", pending.put->timeout_ms(), " ms")
                              : std::string("; the put had no timeout to wait")));
    } else {
      absl::StatusOr<std::vector<IngestedSample>> samples = Transfer(*pending.put, *pending.stream);
      if (samples.ok()) {
        reply = pending.stream->Commit(pending.put->step(), *std::move(samples), pending.bytes);
      } else {
        pending.stream->Unreserve(pending.bytes);
        reply = samples.status();
      }
    }
    if (!reply.ok()) spdlog::warn("ingest: put refused: {}", std::string(reply.status().message()));
    pending.done(std::move(reply));
    it = pending_.erase(it);
  }
}

absl::StatusOr<IngestServer::Producer*> IngestServer::ProducerAt(const std::string& address) {
  auto known = producers_.find(address);
  if (known != producers_.end() && !known->second->failed) return known->second.get();
  if (known != producers_.end()) producers_.erase(known);
  auto producer = std::make_unique<Producer>();
  PF_ASSIGN_OR_RETURN(
      transport::UcpEndpoint endpoint,
      transport::UcpEndpoint::Connect(worker_, address, OnProducerError, &producer->failed));
  producer->endpoint.emplace(std::move(endpoint));
  return producers_.emplace(address, std::move(producer)).first->second.get();
}

absl::StatusOr<std::vector<IngestedSample>> IngestServer::Transfer(const v1::PutRequest& put,
                                                                   const IngestStream& stream) {
  const v1::IngestRegion& region = put.region();
  PF_ASSIGN_OR_RETURN(Producer * producer, ProducerAt(region.worker_address()));
  if (producer->key.get() == nullptr || producer->packed_key != region.remote_key()) {
    producer->key.Reset();
    PF_ASSIGN_OR_RETURN(producer->key,
                        transport::RemoteKey::Unpack(*producer->endpoint, region.remote_key()));
    producer->packed_key = region.remote_key();
  }
  const transport::RemoteKey& key = producer->key;
  // Put order of the fields -> stream order in each sample's buffer.
  std::vector<int> stream_field;
  for (const std::string& name : put.fields()) stream_field.push_back(stream.FieldIndex(name));
  std::vector<IngestedSample> samples(static_cast<size_t>(put.samples_size()));
  std::vector<ucs_status_ptr_t> requests;
  absl::Status posted;
  auto post = [&](void* local, uint64_t bytes, uint64_t offset) {
    ucs_status_ptr_t request =
        producer->endpoint->Get(local, bytes, region.address() + offset, key.get());
    if (UCS_PTR_IS_ERR(request) && posted.ok()) {
      posted = absl::UnavailableError(
          absl::StrCat("ucp_get_nbx: ", ucs_status_string(UCS_PTR_STATUS(request))));
    } else if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
      requests.push_back(request);
    }
  };
  for (int i = 0; i < put.samples_size(); ++i) {
    const v1::IngestSample& in = put.samples(i);
    IngestedSample& out = samples[static_cast<size_t>(i)];
    out.group = in.group();
    out.tag = in.tag();
    out.num_tokens = static_cast<int64_t>(in.tokens());
    uint64_t at = in.tokens() * sizeof(int64_t);
    out.field_offsets.assign(stream.fields().size(), 0);
    for (size_t f = 0; f < stream.fields().size(); ++f) {
      out.field_offsets[f] = at;
      at += in.tokens() * stream.fields()[f].row_bytes();
    }
    out.data_bytes = at;
    // Not zero-filled: the gets overwrite every byte (CheckPut checked each
    // field's size).
    std::shared_ptr<char[]> buffer = std::make_shared_for_overwrite<char[]>(at);
    post(buffer.get(), in.tokens() * sizeof(int64_t), in.offset());
    for (int f = 0; f < in.field_bytes_size(); ++f) {
      const uint64_t bytes = in.field_bytes(f);
      if (bytes > 0) {
        post(buffer.get() + out.field_offsets[static_cast<size_t>(stream_field[f])], bytes,
             in.field_offsets(f));
      }
    }
    out.data = std::move(buffer);
  }
  absl::Status status = posted;
  const absl::Time deadline = absl::Now() + kTransferTimeout;
  for (ucs_status_ptr_t request : requests) {
    absl::Status done = worker_.Wait(request, "ucp_get_nbx", deadline, [&] {
      producer->endpoint->Close(/*force=*/true).IgnoreError();
    });
    if (status.ok() && !done.ok()) status = done;
  }
  if (!status.ok() || producer->failed) {
    producers_.erase(region.worker_address());
    return absl::UnavailableError(
        absl::StrCat("ingest stream ", put.stream(), " step ", put.step(),
                     ": reading the put's bytes from the producer failed: ",
                     status.ok() ? "its endpoint failed" : status.message()));
  }
  return samples;
}

}  // namespace packfeed::server
