#include "packfeed/client/producer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc_status.h"
#include "grpcpp/create_channel.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/v1/service.grpc.pb.h"

namespace packfeed::client {
namespace {

constexpr uint64_t kMinStaging = uint64_t{1} << 20;

uint64_t Aligned(uint64_t offset) { return (offset + 7) & ~uint64_t{7}; }

}  // namespace

struct Producer::Rpc {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Ingest::Stub> ingest;
};

absl::StatusOr<std::unique_ptr<Producer>> Producer::Create(const ProducerOptions& options) {
  if (options.stream.empty())
    return absl::InvalidArgumentError("ProducerOptions.stream is required");
  transport::UcxOptions ucx;
  ucx.transports = options.ucx_transports;
  PF_ASSIGN_OR_RETURN(transport::UcpContext context, transport::UcpContext::Create(ucx));
  PF_ASSIGN_OR_RETURN(transport::UcpWorker worker, transport::UcpWorker::Create(context));
  std::unique_ptr<Producer> producer(new Producer(options, std::move(context), std::move(worker)));
  producer->rpc_ = std::make_unique<Rpc>();
  producer->rpc_->channel =
      grpc::CreateChannel("unix:" + options.socket_path, grpc::InsecureChannelCredentials());
  producer->rpc_->ingest = v1::Ingest::NewStub(producer->rpc_->channel);
  {
    absl::MutexLock lock(&producer->mutex_);
    PF_RETURN_IF_ERROR(producer->EnsureStaging(kMinStaging));
  }
  producer->thread_ = std::thread([p = producer.get()] { p->Progress(); });
  return producer;
}

Producer::Producer(ProducerOptions options, transport::UcpContext context,
                   transport::UcpWorker worker)
    : options_(std::move(options)), context_(std::move(context)), worker_(std::move(worker)) {}

Producer::~Producer() {
  stop_ = true;
  worker_.Signal();
  if (thread_.joinable()) thread_.join();
}

void Producer::Progress() {
  while (!stop_) worker_.ProgressOrWait(absl::Milliseconds(100));
}

uint64_t Producer::staging_bytes() const {
  absl::MutexLock lock(&mutex_);
  return staging_.has_value() ? staging_->length() : 0;
}

absl::Status Producer::EnsureStaging(uint64_t bytes) {
  if (staging_.has_value() && staging_->length() >= bytes) return absl::OkStatus();
  const uint64_t size =
      std::max({bytes, kMinStaging, staging_.has_value() ? 2 * staging_->length() : 0});
  staging_.reset();
  PF_ASSIGN_OR_RETURN(transport::MemoryRegion region,
                      transport::MemoryRegion::Allocate(context_.get(), size));
  PF_ASSIGN_OR_RETURN(remote_key_, region.PackRemoteKey());
  staging_.emplace(std::move(region));
  return absl::OkStatus();
}

absl::StatusOr<v1::PutReply> Producer::Put(int64_t step, absl::Span<const std::string> fields,
                                           absl::Span<const ProducerSample> samples,
                                           absl::Duration wait) {
  absl::MutexLock lock(&mutex_);
  uint64_t total = 0;
  for (const ProducerSample& sample : samples) {
    if (sample.fields.size() != fields.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a sample of group ", sample.group, " has ",
                                                     sample.fields.size(),
                                                     " fields; the put names ", fields.size()));
    }
    total = Aligned(total + sample.tokens.size() * sizeof(int64_t));
    for (absl::Span<const char> field : sample.fields) total = Aligned(total + field.size());
  }
  PF_RETURN_IF_ERROR(EnsureStaging(total));
  v1::PutRequest request;
  request.set_stream(options_.stream);
  request.set_auth_token(options_.auth_token);
  request.set_step(step);
  for (const std::string& name : fields) request.add_fields(name);
  request.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
  char* base = static_cast<char*>(staging_->address());
  uint64_t at = 0;
  auto copy = [&](const void* bytes, uint64_t size) {
    const uint64_t offset = at;
    if (size > 0) std::memcpy(base + offset, bytes, size);
    at = Aligned(at + size);
    return offset;
  };
  for (const ProducerSample& sample : samples) {
    v1::IngestSample* out = request.add_samples();
    out->set_group(sample.group);
    out->set_tag(sample.tag);
    out->set_tokens(sample.tokens.size());
    out->set_offset(copy(sample.tokens.data(), sample.tokens.size() * sizeof(int64_t)));
    for (absl::Span<const char> field : sample.fields) {
      out->add_field_offsets(copy(field.data(), field.size()));
      out->add_field_bytes(field.size());
    }
  }
  v1::IngestRegion* region = request.mutable_region();
  region->set_worker_address(worker_.address());
  region->set_remote_key(remote_key_);
  region->set_address(reinterpret_cast<uint64_t>(base));
  region->set_length(staging_->length());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + wait + options_.call_timeout));
  v1::PutReply reply;
  PF_RETURN_IF_ERROR(FromGrpc(rpc_->ingest->Put(&context, request, &reply),
                              absl::StrCat("put into step ", step), options_.socket_path));
  return reply;
}

absl::StatusOr<v1::SealReply> Producer::Seal(int64_t step) {
  v1::SealRequest request;
  request.set_stream(options_.stream);
  request.set_auth_token(options_.auth_token);
  request.set_step(step);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  v1::SealReply reply;
  PF_RETURN_IF_ERROR(FromGrpc(rpc_->ingest->Seal(&context, request, &reply),
                              absl::StrCat("seal step ", step), options_.socket_path));
  return reply;
}

absl::StatusOr<v1::IngestStreamStats> Producer::Status() {
  v1::IngestStatusRequest request;
  request.set_stream(options_.stream);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  v1::IngestStatusReply reply;
  PF_RETURN_IF_ERROR(FromGrpc(rpc_->ingest->Status(&context, request, &reply), "ingest status",
                              options_.socket_path));
  return reply.stream();
}

}  // namespace packfeed::client
