#include "packfeed/client/producer.h"

#include <atomic>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/src/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "packfeed/common/mutex_mode.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/memory_region.h"
#include "packfeed/transport/ucx_context.h"
#include "packfeed/v1/service.grpc.pb.h"

namespace packfeed::client {
namespace {

constexpr uint64_t kMinStaging = uint64_t{1} << 20;

uint64_t Aligned(uint64_t offset) { return (offset + 7) & ~uint64_t{7}; }

}  // namespace

// The producer's UCX worker and staging region, and its gRPC stub.
class Producer::Impl {
 public:
  Impl(ProducerOptions options, transport::UcpContext context, transport::UcpWorker worker)
      : options_(std::move(options)), context_(std::move(context)), worker_(std::move(worker)) {
    channel_ =
        grpc::CreateChannel("unix:" + options_.socket_path, grpc::InsecureChannelCredentials());
    ingest_ = v1::Ingest::NewStub(channel_);
  }
  ~Impl() {
    stop_ = true;
    worker_.Signal();
    if (thread_.joinable()) thread_.join();
  }

  // Maps the first staging region and starts the progress thread.
  absl::Status Start();
  absl::StatusOr<PutResult> Put(int64_t step, absl::Span<const std::string> fields,
                                absl::Span<const ProducerSample> samples, absl::Duration wait);
  absl::StatusOr<SealResult> Seal(int64_t step);
  absl::StatusOr<IngestStreamStatus> Status();
  uint64_t staging_bytes() const;

 private:
  absl::Status EnsureStaging(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Progress() {
    while (!stop_) worker_.ProgressOrWait(absl::Milliseconds(100));
  }

  const ProducerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ingest::Stub> ingest_;
  transport::UcpContext context_;
  transport::UcpWorker worker_;  // progressed by thread_ only
  std::string remote_key_ ABSL_GUARDED_BY(mutex_);
  std::optional<transport::MemoryRegion> staging_ ABSL_GUARDED_BY(mutex_);
  mutable absl::Mutex mutex_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<Producer>> Producer::Create(const ProducerOptions& options) {
  UseReleaseMutexChecks();
  if (options.stream.empty())
    return absl::InvalidArgumentError("ProducerOptions.stream is required");
  PF_RETURN_IF_ERROR(CheckUnixSocketPath(options.socket_path));
  transport::UcxOptions ucx;
  ucx.transports = options.ucx_transports;
  PF_ASSIGN_OR_RETURN(transport::UcpContext context, transport::UcpContext::Create(ucx));
  PF_ASSIGN_OR_RETURN(transport::UcpWorker worker, transport::UcpWorker::Create(context));
  auto impl = std::make_unique<Impl>(options, std::move(context), std::move(worker));
  PF_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Producer>(new Producer(std::move(impl)));
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
uint64_t Producer::staging_bytes() const { return impl_->staging_bytes(); }

absl::Status Producer::Impl::Start() {
  {
    absl::MutexLock lock(&mutex_);
    PF_RETURN_IF_ERROR(EnsureStaging(kMinStaging));
  }
  thread_ = std::thread([this] { Progress(); });
  return absl::OkStatus();
}

uint64_t Producer::Impl::staging_bytes() const {
  absl::MutexLock lock(&mutex_);
  return staging_.has_value() ? staging_->length() : 0;
}

absl::Status Producer::Impl::EnsureStaging(uint64_t bytes) {
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

absl::StatusOr<PutResult> Producer::Impl::Put(int64_t step, absl::Span<const std::string> fields,
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
  PF_RETURN_IF_ERROR(DaemonCallStatus(ingest_->Put(&context, request, &reply),
                                      absl::StrCat("put into step ", step), options_.socket_path));
  return PutResult{reply.samples_held(), reply.bytes_held()};
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
