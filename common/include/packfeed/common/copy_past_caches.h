#ifndef PACKFEED_COMMON_COPY_PAST_CACHES_H_
#define PACKFEED_COMMON_COPY_PAST_CACHES_H_

// A copy into memory that another process reads later, not this thread
// soon: a producer's samples into the staging arena the daemon serves them
// from. An ordinary memcpy first reads each destination line into the
// cache (to own it) and later writes it back: three passes over memory for
// two. x86's non-temporal stores write whole lines past the caches: on the
// 2-core development VM a 20 MB put of 384 arrays copied in 0.65-0.75 of
// memcpy's time (docs/INGEST.md). glibc's memcpy switches to them only for
// single copies larger than about the last-level cache, which a put's
// arrays, one at a time, never are.
//
// The stores are weakly ordered: call FenceCopiesPastCaches() after the
// last copy and before telling anyone the bytes are there. Elsewhere than
// x86-64 both are memcpy and nothing.

#include <cstddef>

namespace packfeed {

void CopyPastCaches(void* destination, const void* source, size_t bytes);
void FenceCopiesPastCaches();

}  // namespace packfeed

#endif  // PACKFEED_COMMON_COPY_PAST_CACHES_H_
