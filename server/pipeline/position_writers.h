#ifndef PACKFEED_SERVER_PIPELINE_POSITION_WRITERS_H_
#define PACKFEED_SERVER_PIPELINE_POSITION_WRITERS_H_

// The per-token fields of one sequence's positions, as each sample kind's
// Megatron dataset makes them (pack.cc's write calls these for each range
// of a rank's CP slice).

#include <cstdint>
#include <vector>

#include "packfeed/dataset/sample_rules.h"
#include "packfeed/scheduler/thd_partition.h"
#include "server/pipeline/document_mask.h"

namespace packfeed::server {

// Where a microbatch's per-token fields lie (in the slot); null: the
// rank's stage does not receive the field.
struct TokenFields {
  int64_t* tokens = nullptr;
  int64_t* labels = nullptr;
  float* loss_mask = nullptr;
  int64_t* position_ids = nullptr;
  uint8_t* padding_mask = nullptr;
};

// Positions [begin, end) of a sequence (real length `real`; its token run
// `run`) at position `at` of the fields, by the sample kind of `rules`.
void WritePositions(absl::Span<const int64_t> run, int64_t real, int64_t begin, int64_t end,
                    const dataset::SampleRules& rules, int64_t at, const TokenFields& out);

// inter_document_masking: positions [range) of a sample count from the
// start of their document (`bounds`), as Megatron-Core 0.19 restarts them.
void RestartPositions(const SampleBounds& bounds, scheduler::TokenRange range, int64_t at,
                      int64_t* position_ids);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_POSITION_WRITERS_H_
