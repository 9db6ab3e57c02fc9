#ifndef PACKFEED_SERVER_PIPELINE_COST_VERSIONS_H_
#define PACKFEED_SERVER_PIPELINE_COST_VERSIONS_H_

// The versions of a job's learned cost model (docs/SCHEDULER.md, "One
// learned model on every node"). Version 0 is the configured model, from
// step 0; each later version plans every step from its from_step on. The
// job's leader daemon fits and announces versions; every node adopts each
// one only while it has not planned its from_step yet, so two nodes never
// plan one step by different versions unless one missed the announcement,
// and then it keeps the older version and says so (missed()). Adopted
// versions are journaled to the state file, one line each, so that a
// restarted daemon plans its steps by the versions it planned them by.
//
// Thread-safe: the planner thread plans by it while the daemon's sync
// thread and admin calls adopt and read.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "packfeed/scheduler/cost_model.h"

namespace packfeed::server {

struct CostModelVersion {
  uint32_t version = 0;
  int64_t from_step = 0;
  scheduler::CostModel model;

  bool operator==(const CostModelVersion&) const = default;
};

class CostModelVersions {
 public:
  // Version 0 is `configured`.
  explicit CostModelVersions(const scheduler::CostModel& configured);

  // Takes up the versions journaled at `path` and appends new ones there,
  // so that a restarted daemon plans its steps by the versions it planned
  // them by. DataLoss names the file and line of an entry that does not
  // parse (a torn last line, without its newline, is dropped with a
  // warning). Call before the first plan.
  absl::Status JournalTo(const std::string& path);

  // The version that plans `step`.
  CostModelVersion ForStep(int64_t step) const;
  // The same, for the plan the job serves: from now on no version may take
  // effect at or before `step` on this node.
  CostModelVersion ForPlanning(int64_t step);

  enum class Offered { kAdopted, kHeld, kTooLate };
  // A version announced by the leader. kHeld: this node holds it already;
  // kTooLate: this node planned its from_step already, so it keeps planning
  // by the version before (counted in missed()). InvalidArgument for a
  // version that does not follow the latest (number or from_step not
  // above it) or differs from the one held under its number.
  absl::StatusOr<Offered> Offer(const CostModelVersion& version);

  std::vector<CostModelVersion> All() const;  // oldest first
  CostModelVersion Latest() const;
  int64_t planned_through() const;  // -1 before the first plan
  int64_t missed() const;           // versions offered too late

 private:
  absl::Status Append(const CostModelVersion& version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  const CostModelVersion& ForStepLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mutex_);

  std::string state_path_;
  mutable absl::Mutex mutex_;
  std::vector<CostModelVersion> versions_ ABSL_GUARDED_BY(mutex_);
  int64_t planned_through_ ABSL_GUARDED_BY(mutex_) = -1;
  int64_t missed_ ABSL_GUARDED_BY(mutex_) = 0;  // versions, each counted once
  uint32_t last_missed_ ABSL_GUARDED_BY(mutex_) = 0;
};

// One version as a journal line (hexadecimal floats, so that it reads back
// to the same bits) and back.
std::string CostModelVersionLine(const CostModelVersion& version);
absl::StatusOr<CostModelVersion> ParseCostModelVersionLine(const std::string& line);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_COST_VERSIONS_H_
