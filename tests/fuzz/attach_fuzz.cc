// libFuzzer target for the control plane's attach requests: any bytes a
// client sends as an AttachRequest must be refused with a status, or pass
// only when every promise of CheckAttachRequest holds (the token matches,
// the rank is this node's, the ring is big enough, the start is sane).
//
// An input whose first byte is odd is merged over a valid request, so the
// fuzzer spends its time on one bad field at a time rather than on getting
// every field right.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "packfeed/dataset/dataset_generator.h"
#include "packfeed/transport/wire.h"
#include "server/config/daemon_config.h"
#include "server/control/attach_check.h"
#include "server/pipeline/job.h"
#include "tests/unit/server/pipeline/job_of_config.h"

namespace {

struct Subject {
  std::unique_ptr<packfeed::server::Job> job;
  packfeed::v1::AttachRequest valid;
};

Subject* MakeSubject() {
  const std::string dir =
      std::filesystem::temp_directory_path() / absl::StrCat("pf-attach-fuzz-", getpid());
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/data";
  if (!packfeed::dataset::WriteGeneratedDataset(prefix, {5, 9, 14, 3, 30, 7, 8, 11}, {}).ok())
    abort();
  auto config = packfeed::server::ParseDaemonConfig(absl::StrCat(R"(jobs {
    name: "job"
    datasets { prefix: ")",
                                                                 prefix, R"(" }
    topology { tp: 2 pp: 1 cp: 1 dp: 2 }
    global_batch: 4
    seq_length: 32
    auth_token: "secret"
    local_ranks: [0, 1]
    scheduler { kind: "balanced" max_tokens_per_rank: 64 }
  })"),
                                                    "fuzz");
  if (!config.ok()) abort();
  auto job = packfeed::server::JobOfConfig(config->jobs(0));
  std::filesystem::remove_all(dir);  // the job holds what it needs mapped
  if (!job.ok()) abort();
  auto* subject = new Subject{*std::move(job), {}};
  subject->valid.set_job("job");
  subject->valid.set_global_rank(1);
  subject->valid.set_auth_token("secret");
  subject->valid.set_fingerprint(subject->job->fingerprint());
  subject->valid.mutable_ring()->set_slots(4);
  subject->valid.mutable_ring()->set_slot_bytes(subject->job->required_slot_bytes());
  subject->valid.mutable_ring()->set_ring_descriptor(
      packfeed::transport::EncodeRingDescriptor({4, subject->job->required_slot_bytes(), 4096,
                                                 packfeed::transport::MemoryKind::kHost, "key"}));
  if (!packfeed::server::CheckAttachRequest(*subject->job, subject->valid).ok()) abort();
  return subject;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Subject* subject = MakeSubject();
  if (size == 0) return 0;
  packfeed::v1::AttachRequest request;
  if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  if (data[0] & 1) {
    packfeed::v1::AttachRequest merged = subject->valid;
    merged.MergeFrom(request);
    request = std::move(merged);
  }
  if (packfeed::server::CheckAttachRequest(*subject->job, request).ok()) {
    const packfeed::server::Job& job = *subject->job;
    auto ring = packfeed::transport::DecodeRingDescriptor(request.ring().ring_descriptor());
    const bool promised =
        request.auth_token() == "secret" && job.IsLocal(static_cast<int>(request.global_rank())) &&
        ring.ok() && ring->slot_bytes >= job.required_slot_bytes() && request.start_step() >= 0 &&
        (!request.elastic() || request.start_microbatch() == 0);
    if (!promised) __builtin_trap();
  }
  return 0;
}
