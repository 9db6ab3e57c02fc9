#include "server/internal/job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/server/job_config.h"
#include "server/internal/fingerprint.h"
#include "server/internal/pack.h"

namespace packfeed::server {
namespace {

std::string Canonical(std::initializer_list<int64_t> values) {
  std::string out;
  for (int64_t v : values) absl::StrAppend(&out, v, ";");
  return out;
}

}  // namespace

RankCoords JobLayout::Coords(int global_rank) const {
  RankCoords c;
  c.tp = global_rank % tp;
  int rest = global_rank / tp;
  c.cp = rest % cp;
  rest /= cp;
  c.dp = rest % dp;
  c.pp = rest / dp;
  c.dp_cp_rank = c.cp + cp * c.dp;
  return c;
}

absl::StatusOr<std::shared_ptr<const dataset::IndexedDataset>> OpenDatasetAlone(
    const std::string& prefix) {
  PF_ASSIGN_OR_RETURN(dataset::IndexedDataset dataset, dataset::IndexedDataset::Open(prefix));
  return std::make_shared<const dataset::IndexedDataset>(std::move(dataset));
}

absl::StatusOr<std::unique_ptr<Job>> Job::Create(const v1::JobConfig& config,
                                                 const DatasetOpener& open) {
  std::unique_ptr<Job> job(new Job());
  job->config_ = config;
  const v1::Topology& t = config.topology();
  job->layout_ = {static_cast<int>(t.tp()), static_cast<int>(t.pp()), static_cast<int>(t.cp()),
                  static_cast<int>(t.dp()), t.sequence_parallel()};
  PF_ASSIGN_OR_RETURN(job->planner_, PlannerOptionsOf(config));
  if (job->planner_.kind == scheduler::SchedulerKind::kDynamicCp) {
    PF_RETURN_IF_ERROR(scheduler::ResolveCpRange(job->planner_).status());
  }
  job->rules_ = SampleRulesOf(config);

  std::string datasets_part;
  std::vector<int64_t> num_documents;
  for (const v1::DatasetSpec& spec : config.datasets()) {
    PF_ASSIGN_OR_RETURN(std::shared_ptr<const dataset::IndexedDataset> dataset,
                        open(spec.prefix()));
    if (dataset->num_documents() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(spec.prefix(), ": the dataset holds no document"));
    }
    absl::StrAppend(&datasets_part, IndexDigest(dataset->index_bytes()), ";", dataset->bin_bytes(),
                    ";", spec.kind(), ";", spec.weight(), "|");
    num_documents.push_back(static_cast<int64_t>(dataset->num_documents()));
    job->datasets_.push_back(std::move(dataset));
  }
  PF_ASSIGN_OR_RETURN(scheduler::Sampler sampler,
                      scheduler::Sampler::Create(SamplerOptionsOf(config, num_documents)));
  job->sampler_ = std::make_unique<scheduler::Sampler>(std::move(sampler));

  const v1::SchedulerConfig& s = config.scheduler();
  FingerprintInputs parts;
  parts.datasets = datasets_part;
  parts.topology =
      Canonical({t.tp(), t.pp(), t.cp(), t.dp(), t.vpp_group_size(), t.sequence_parallel()});
  parts.batch = Canonical({config.global_batch(), config.seq_length(), config.eod_id(),
                           config.pad_id(), config.append_eod()});
  parts.scheduler = absl::StrCat(
      s.kind(), ";", s.cost_model(), ";", s.cp_upgrade_budget(), ";",
      Canonical({s.max_tokens_per_rank(), s.min_cp(), s.max_cp(), s.max_sequences_per_pack()}));
  parts.sampler = Canonical({config.sampler(), static_cast<int64_t>(config.seed())});
  job->fingerprint_ = MakeFingerprint(parts);

  for (uint32_t rank : config.local_ranks()) job->local_ranks_.push_back(static_cast<int>(rank));
  if (job->local_ranks_.empty()) {
    for (int r = 0; r < job->layout_.world_size(); ++r) job->local_ranks_.push_back(r);
  }
  std::sort(job->local_ranks_.begin(), job->local_ranks_.end());

  // The worst case of every stage: a rank's tokens are capped by the
  // planner; a microbatch holds at most the whole batch's sequences.
  const bool dynamic = job->planner_.kind == scheduler::SchedulerKind::kDynamicCp;
  PF_ASSIGN_OR_RETURN(job->required_slot_bytes_,
                      MaxSlotBytes(s.max_tokens_per_rank(), config.global_batch(),
                                   dynamic ? job->layout_.dp_cp_size() : 0));
  return job;
}

bool Job::IsLocal(int global_rank) const {
  return std::binary_search(local_ranks_.begin(), local_ranks_.end(), global_rank);
}

}  // namespace packfeed::server
