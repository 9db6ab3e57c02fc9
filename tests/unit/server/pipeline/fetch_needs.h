#ifndef PACKFEED_TESTS_UNIT_SERVER_PIPELINE_FETCH_NEEDS_H_
#define PACKFEED_TESTS_UNIT_SERVER_PIPELINE_FETCH_NEEDS_H_

// A step's needs fetched as the Storage would fetch them, for the tests of
// the read phase without a Storage.

#include <algorithm>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/pipeline/read.h"

namespace packfeed::server {

inline std::vector<FetchedSample> FetchNeeds(const StepNeeds& needs) {
  std::vector<FetchedSample> fetched;
  for (const SampleNeed& need : needs.needs) {
    auto buffer = std::shared_ptr<char[]>(new char[std::max<uint64_t>(need.bytes, 1)]);
    const dataset::IndexView& index = need.dataset->index();
    const uint64_t at = index.pointer(static_cast<uint64_t>(
                            index.document_index(static_cast<uint64_t>(need.document)))) +
                        need.offset;
    EXPECT_TRUE(need.dataset->ReadBytes(at, {buffer.get(), need.bytes}).ok());
    fetched.push_back({buffer, 0, need.bytes, absl::OkStatus()});
  }
  return fetched;
}

}  // namespace packfeed::server

#endif  // PACKFEED_TESTS_UNIT_SERVER_PIPELINE_FETCH_NEEDS_H_
