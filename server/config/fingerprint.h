#ifndef PACKFEED_SERVER_CONFIG_FINGERPRINT_H_
#define PACKFEED_SERVER_CONFIG_FINGERPRINT_H_

// A job's fingerprint (docs/DAEMON.md): a hash of everything that changes the
// plan or the bytes, in named parts so that a mismatch says what differs.
// Stable across processes and machines (XXH3 over a canonical encoding; no
// std::hash, no paths): two nodes with the same datasets mounted at
// different places agree.
//
//   pf1-d<datasets>-t<topology>-b<batch>-s<scheduler>-r<sampler>
//
// each part 8 hex digits. The hosted ranks and the socket are not part of it.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace packfeed::server {

struct FingerprintInputs {
  std::string datasets;  // per dataset: content digest of .idx, .bin size, kind, weight
  std::string topology;
  std::string batch;  // global batch, seq_length, ids, EOD rule
  std::string scheduler;
  std::string sampler;  // mode, seed
};

std::string MakeFingerprint(const FingerprintInputs& inputs);

// OK when equal. FailedPrecondition naming each part that differs, or
// InvalidArgument when `expected` is not a fingerprint at all. `data_only`
// compares only what decides which samples each step holds (datasets, batch,
// sampler): an elastic resume may change the topology and the scheduler.
absl::Status CompareFingerprints(absl::string_view expected, absl::string_view actual,
                                 bool data_only = false);

// XXH3-64 of `bytes`, the digest every part uses.
uint64_t StableHash(absl::string_view bytes);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONFIG_FINGERPRINT_H_
