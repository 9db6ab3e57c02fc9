#ifndef PACKFEED_TRANSPORT_SRC_CUDA_STATUS_H_
#define PACKFEED_TRANSPORT_SRC_CUDA_STATUS_H_

// The one conversion of a CUDA runtime error to a Status, for this
// library's CUDA files (compiled only with the toolkit, PF_HAVE_CUDA).

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace packfeed::transport {

// OK for cudaSuccess. Otherwise "call: CUDA's text", ResourceExhausted when
// the device is out of memory and FailedPrecondition for anything else: the
// device or driver cannot do what was asked, which callers answer by
// falling back (a staged ring instead of one in device memory). Clears the
// runtime's last error, so that a non-sticky failure does not surface again
// in a later, unrelated call.
absl::Status CudaStatus(cudaError_t error, const char* call);

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_SRC_CUDA_STATUS_H_
