#ifndef PACKFEED_COMMON_MUTEX_MODE_H_
#define PACKFEED_COMMON_MUTEX_MODE_H_

// Abseil checks every mutex acquisition for lock-order cycles when Abseil
// itself was built without NDEBUG, as Debian's is: a graph lookup per lock.
// In a client's progress thread, which takes its mutex a few times per
// spin, that lookup was the largest single cost (docs/PYTHON.md, "Speed").
// A release build of packfeed (NDEBUG) turns the check off for the process,
// as an Abseil built with NDEBUG has it; debug and sanitizer builds keep it.
// Idempotent; the daemon calls it at start, the client libraries at attach.

namespace packfeed {

void UseReleaseMutexChecks();

}  // namespace packfeed

#endif  // PACKFEED_COMMON_MUTEX_MODE_H_
