#include "packfeed/common/mutex_mode.h"

#include "absl/synchronization/mutex.h"

namespace packfeed {

void UseReleaseMutexChecks() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace packfeed
