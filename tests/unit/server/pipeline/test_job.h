// The job the runner's tests serve (job_runner_fixture.h,
// runner_parts_fixture.h): its data and its configuration.
#ifndef PACKFEED_TESTS_UNIT_SERVER_PIPELINE_TEST_JOB_H_
#define PACKFEED_TESTS_UNIT_SERVER_PIPELINE_TEST_JOB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "packfeed/dataset/dataset_generator.h"

namespace packfeed::server {

// 400 generated documents of 20-200 tokens at `prefix`; with `side_field`,
// an int16 [2, 2] side field "experts" beside them (PREFIX_experts).
inline absl::Status WriteTestJobData(const std::string& prefix, bool side_field) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < 400; ++i) lengths.push_back(20 + (i * 37) % 181);
  if (absl::Status written = dataset::WriteGeneratedDataset(prefix, lengths, {}); !written.ok()) {
    return written;
  }
  if (!side_field) return absl::OkStatus();
  const dataset::GeneratedSideField experts{"experts", dataset::GeneratedSideField::Kind::kExperts,
                                            /*layers=*/2, /*top_k=*/2,
                                            /*experts=*/8};
  return dataset::WriteGeneratedSideField(prefix + "_experts", lengths, experts, 1);
}

// The job's configuration without its name: dp x tp ranks, global batch
// 16, seq_length 256, the balanced scheduler at 256 tokens a rank.
inline std::string TestJobBody(const std::string& prefix, int dp, int tp, bool side_field) {
  return absl::StrCat("datasets { prefix: \"", prefix, "\" } topology { dp: ", dp,
                      tp == 1 ? "" : absl::StrCat(" tp: ", tp),
                      " } global_batch: 16 seq_length: 256 eod_id: 0 seed: 3 "
                      "scheduler { kind: \"balanced\" max_tokens_per_rank: 256 }",
                      side_field ? " side_fields { name: \"experts\" dtype: \"int16\" "
                                   "inner_shape: [2, 2] pad_value: -1 }"
                                 : "");
}

}  // namespace packfeed::server

#endif  // PACKFEED_TESTS_UNIT_SERVER_PIPELINE_TEST_JOB_H_
