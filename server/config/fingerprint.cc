#include "server/config/fingerprint.h"

#include <xxhash.h>

#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace packfeed::server {
namespace {

struct Part {
  char tag;
  const char* name;
  bool data;  // decides which samples a step holds
};
constexpr std::array<Part, 5> kParts = {{{'d', "datasets", true},
                                         {'t', "topology", false},
                                         {'b', "batch", true},
                                         {'s', "scheduler", false},
                                         {'r', "sampler", true}}};

}  // namespace

uint64_t StableHash(absl::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string MakeFingerprint(const FingerprintInputs& inputs) {
  const std::array<const std::string*, 5> values = {
      &inputs.datasets, &inputs.topology, &inputs.batch, &inputs.scheduler, &inputs.sampler};
  std::string out = "pf1";
  for (size_t i = 0; i < kParts.size(); ++i) {
    absl::StrAppend(&out, "-", std::string(1, kParts[i].tag),
                    absl::StrFormat("%08x", static_cast<uint32_t>(StableHash(*values[i]))));
  }
  return out;
}

absl::Status CompareFingerprints(absl::string_view expected, absl::string_view actual,
                                 bool data_only) {
  if (expected == actual) return absl::OkStatus();
  const std::vector<absl::string_view> want = absl::StrSplit(expected, '-');
  const std::vector<absl::string_view> have = absl::StrSplit(actual, '-');
  bool well_formed = want.size() == kParts.size() + 1 && want[0] == "pf1";
  for (size_t i = 1; well_formed && i < want.size(); ++i) {
    well_formed = want[i].size() == 9 && want[i][0] == kParts[i - 1].tag;
  }
  if (!well_formed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", expected, "' is not a packfeed job fingerprint (daemon has ", actual, ")"));
  }
  std::vector<std::string> differing;
  for (size_t i = 0; i < kParts.size(); ++i) {
    if (want[i + 1] != have[i + 1] && (kParts[i].data || !data_only)) {
      differing.push_back(kParts[i].name);
    }
  }
  if (differing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("job fingerprint mismatch: ", absl::StrJoin(differing, ", "), " differ",
                   data_only ? " (an elastic resume may change only topology and scheduler)" : "",
                   " (expected ", expected, ", daemon has ", actual, ")"));
}

}  // namespace packfeed::server
