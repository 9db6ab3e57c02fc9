#ifndef PACKFEED_TRANSPORT_PUT_PROTOCOL_H_
#define PACKFEED_TRANSPORT_PUT_PROTOCOL_H_

// How UCX carries a put, read from the description UCX gives of the request
// (ucp_request_query). With UCX's protocols v2 that description names the
// protocol UCX selected for the put's size and memory types, the same text
// UCX_PROTO_INFO=y prints. A ring in device memory is worth having only when
// a transport writes into it (GPUDirect RDMA): on an H100 with UCX 1.22 a put
// from host memory into CUDA memory on the same node was described as "rndv
// using fragmented copy-in copy-out", software that moved 0.8 GiB/s where the
// copy engine moves 42-50 GiB/s (docs/TRANSPORT.md).

#include "absl/strings/string_view.h"

namespace packfeed::transport {

enum class PutPath {
  kTransportWrite,  // zero-copy: the transport writes the remote memory itself
  // A rendezvous or a copy-in/copy-out pipeline: UCX software on the two
  // sides moves the bytes through bounce buffers.
  kEmulated,
  // Anything else, including UCX's protocols v1 (UCX 1.13's default), whose
  // requests describe no protocol.
  kUnknown,
};

PutPath ClassifyPut(absl::string_view description);
absl::string_view PutPathName(PutPath path);

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_PUT_PROTOCOL_H_
